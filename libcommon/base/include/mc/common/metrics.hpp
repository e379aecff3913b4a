// A small metrics registry: counters, gauges and histograms, rendered as Prometheus text
// exposition format (version 0.0.4) and as JSON (for `stat` replies and --json reports).
//
// Names follow Prometheus conventions with units in the name (mc_store_get_bytes_total,
// mc_rpc_latency_seconds). Histograms have fixed upper bounds given at creation.
// Thread-safety: metric updates are lock-free atomics, safe from any thread; registration and
// rendering take a mutex. Metrics are owned by the registry and live as long as it does.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace mc::metrics {

class Counter {
 public:
  void inc(uint64_t n = 1) { v_.fetch_add(n, std::memory_order_relaxed); }
  // Mirrors a total counted elsewhere (a snapshot of another object's monotonic count). A smaller value than
  // before reads as a reset, as Prometheus reads a restarted process's counters.
  void set(uint64_t total) { v_.store(total, std::memory_order_relaxed); }
  uint64_t value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

class Gauge {
 public:
  void set(double v) { v_.store(v, std::memory_order_relaxed); }
  void add(double d);
  double value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0};
};

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  std::vector<uint64_t> bucket_counts() const;  // per bound, not cumulative; last = +Inf
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  double sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0};
};

class Registry {
 public:
  // Returns the metric of that name, creating it on first use. `help` is used at creation.
  Counter& counter(const std::string& name, const std::string& help = "");
  Gauge& gauge(const std::string& name, const std::string& help = "");
  Histogram& histogram(const std::string& name, std::vector<double> upper_bounds, const std::string& help = "");

  std::string prometheus_text() const;
  // {"counters":{name:value}, "gauges":{...}, "histograms":{name:{"count","sum","buckets":[[le,count],...]}}}
  std::string json() const;

 private:
  template <typename T>
  struct Entry {
    std::string help;
    std::unique_ptr<T> metric;
  };
  mutable std::mutex mu_;
  std::map<std::string, Entry<Counter>> counters_;
  std::map<std::string, Entry<Gauge>> gauges_;
  std::map<std::string, Entry<Histogram>> histograms_;
};

// Latency buckets in seconds, 10 µs .. 100 s.
std::vector<double> latency_buckets_s();

}  // namespace mc::metrics
