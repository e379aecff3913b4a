// A transport for tests: no I/O. Records every slice, completes it at once (synchronously from post),
// and fails slices on the paths listed in fail_paths (a broken link).
#pragma once

#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "mc/proto/transfer.hpp"
#include "mc/transfer/transport.hpp"

namespace mc::transfer::testing {

struct MockLog {
  std::mutex mu;
  std::vector<SliceOp> posted;
  std::set<int> fail_paths;
  bool touch_memory = false;  // memset local bytes on READ (only when local memory is real)
  uint64_t bytes_ok = 0;
  // Per path (by index): (local device, remote device) its PathSpec names; paths past the end name none.
  std::vector<std::pair<std::string, std::string>> devices;
  Code fail_code = Code::kUnavailable;  // what a slice on a path of fail_paths fails with
};

class MockSegment final : public TransportSegment {
 public:
  MockSegment(SliceSink* sink, MockLog* log, int paths) : sink_(sink), log_(log) {
    for (int i = 0; i < paths; ++i) {
      const auto dev = static_cast<size_t>(i) < log->devices.size() ? log->devices[static_cast<size_t>(i)]
                                                                    : std::pair<std::string, std::string>{};
      specs_.push_back(PathSpec{"mock" + std::to_string(i), dev.first, dev.second, 1.0});
    }
  }
  const std::vector<PathSpec>& paths() const override { return specs_; }
  void post(const SliceOp& op) override {
    bool fail;
    {
      std::lock_guard<std::mutex> lk(log_->mu);
      log_->posted.push_back(op);
      fail = log_->fail_paths.count(op.path) > 0;
      if (!fail) log_->bytes_ok += op.length;
    }
    sink_->slice_done(
        op.cookie, fail ? Status(log_->fail_code, "mock path " + std::to_string(op.path) + " is down") : Status::ok());
  }
  Status probe(int path, int64_t) override {
    std::lock_guard<std::mutex> lk(log_->mu);
    return log_->fail_paths.count(path) ? Status(Code::kUnavailable, "mock probe failed") : Status::ok();
  }

 private:
  SliceSink* sink_;
  MockLog* log_;
  std::vector<PathSpec> specs_;
};

class MockTransport final : public Transport {
 public:
  MockTransport(MockLog* log, int paths) : log_(log), paths_(paths) {}
  std::string_view name() const override { return "mock"; }
  int rank() const override { return -1; }
  Result<std::unique_ptr<TransportSegment>> open(const proto::SegmentDescriptor&, SliceSink* sink) override {
    return std::unique_ptr<TransportSegment>(std::make_unique<MockSegment>(sink, log_, paths_));
  }

 private:
  MockLog* log_;
  int paths_;
};

// A descriptor of a remote segment with one region of `size` bytes (no memory behind it).
inline proto::SegmentDescriptor fake_descriptor(const std::string& name, uint64_t size, uint64_t region_bytes = 0) {
  proto::SegmentDescriptor d;
  d.format_version = proto::kSegmentDescriptorVersion;
  d.name = name;
  d.host_id = "elsewhere";
  const uint64_t chunk = region_bytes == 0 ? size : region_bytes;
  for (uint64_t off = 0; off < size; off += chunk) {
    proto::RegionDescriptor r;
    r.segment_offset = off;
    r.length_bytes = std::min(chunk, size - off);
    r.location = "cpu:0";
    d.regions.push_back(r);
  }
  return d;
}

}  // namespace mc::transfer::testing
