#include "mc/common/metrics.hpp"

#include <charconv>
#include <cmath>
#include <sstream>

#include <nlohmann/json.hpp>

namespace mc::metrics {

void Gauge::add(double d) {
  double cur = v_.load(std::memory_order_relaxed);
  while (!v_.compare_exchange_weak(cur, cur + d, std::memory_order_relaxed)) {
  }
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  double cur = sum_.load(std::memory_order_relaxed);
  while (!sum_.compare_exchange_weak(cur, cur + v, std::memory_order_relaxed)) {
  }
}

std::vector<uint64_t> Histogram::bucket_counts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i) out[i] = buckets_[i].load(std::memory_order_relaxed);
  return out;
}

Counter& Registry::counter(const std::string& name, const std::string& help) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& e = counters_[name];
  if (!e.metric) e = {help, std::make_unique<Counter>()};
  return *e.metric;
}

Gauge& Registry::gauge(const std::string& name, const std::string& help) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& e = gauges_[name];
  if (!e.metric) e = {help, std::make_unique<Gauge>()};
  return *e.metric;
}

Histogram& Registry::histogram(const std::string& name, std::vector<double> upper_bounds, const std::string& help) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& e = histograms_[name];
  if (!e.metric) e = {help, std::make_unique<Histogram>(std::move(upper_bounds))};
  return *e.metric;
}

namespace {
std::string fmt_double(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // The shortest text that reads back as v (1e-05, not 1.0000000000000001e-05).
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}
// A HELP text as the exposition format wants it: backslash and line feed escaped.
std::string help_text(const std::string& help) {
  std::string out;
  for (char c : help) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}
}  // namespace

std::string Registry::prometheus_text() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream os;
  // A name may carry labels ("mc_store_tenant_bytes{tenant=\"bob\"}"): HELP and TYPE are written once per family,
  // before its first series (the names sort a family's labelled series together).
  std::string family;
  const auto header = [&](const std::string& name, const std::string& help, const char* type) {
    const std::string base = name.substr(0, name.find('{'));
    if (base == family) return;
    family = base;
    if (!help.empty()) os << "# HELP " << base << ' ' << help_text(help) << '\n';
    os << "# TYPE " << base << ' ' << type << '\n';
  };
  for (const auto& [name, e] : counters_) {
    header(name, e.help, "counter");
    os << name << ' ' << e.metric->value() << '\n';
  }
  family.clear();
  for (const auto& [name, e] : gauges_) {
    header(name, e.help, "gauge");
    os << name << ' ' << fmt_double(e.metric->value()) << '\n';
  }
  for (const auto& [name, e] : histograms_) {
    if (!e.help.empty()) os << "# HELP " << name << ' ' << help_text(e.help) << '\n';
    os << "# TYPE " << name << " histogram\n";
    auto counts = e.metric->bucket_counts();
    uint64_t cum = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      cum += counts[i];
      std::string le = i < e.metric->bounds().size() ? fmt_double(e.metric->bounds()[i]) : "+Inf";
      os << name << "_bucket{le=\"" << le << "\"} " << cum << '\n';
    }
    os << name << "_sum " << fmt_double(e.metric->sum()) << '\n' << name << "_count " << e.metric->count() << '\n';
  }
  return os.str();
}

std::string Registry::json() const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json j;
  j["counters"] = nlohmann::json::object();
  j["gauges"] = nlohmann::json::object();
  j["histograms"] = nlohmann::json::object();
  for (const auto& [name, e] : counters_) j["counters"][name] = e.metric->value();
  for (const auto& [name, e] : gauges_) j["gauges"][name] = e.metric->value();
  for (const auto& [name, e] : histograms_) {
    nlohmann::json h;
    h["count"] = e.metric->count();
    h["sum"] = e.metric->sum();
    auto counts = e.metric->bucket_counts();
    nlohmann::json buckets = nlohmann::json::array();
    for (size_t i = 0; i < counts.size(); ++i) {
      if (i < e.metric->bounds().size())
        buckets.push_back({e.metric->bounds()[i], counts[i]});
      else
        buckets.push_back({"+Inf", counts[i]});
    }
    h["buckets"] = buckets;
    j["histograms"][name] = h;
  }
  return j.dump();
}

std::vector<double> latency_buckets_s() {
  return {1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2,
          5e-2, 0.1,    0.25, 0.5,  1,      2.5,  5,    10,     25,   50,   100};
}

}  // namespace mc::metrics
