// The topology matrix: for each memory location ("cpu:0", "cuda:0"), the devices (network interfaces,
// RDMA devices) preferred to move its bytes and those usable as fallback — in the paper's words, the
// transfer engine picks "the NIC closest to the memory" (Mooncake §5, transfer engine).
//
// Sources: discover() reads sysfs (/sys/class/net/*, /sys/class/infiniband/*, their device/numa_node, and
// /sys/devices/system/node/node*): a device on the location's NUMA node (or with unknown node) is preferred,
// any other is fallback. Or load() reads a JSON file of the same shape as to_json():
//   {"version": 1,
//    "devices": [{"name": "eth0", "kind": "net", "numa_node": 0, "addresses": ["10.0.0.2"]}, ...],
//    "matrix": {"cpu:0": {"preferred": ["eth0"], "fallback": ["eth1"]}, ...}}
// Thread-safety: immutable after construction; share freely.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "mc/common/status.hpp"

namespace mc::transfer {

struct TopologyDevice {
  std::string name;                    // "eth0", "lo", "mlx5_0"
  std::string kind;                    // "net" | "rdma"
  int numa_node = -1;                  // -1 = unknown
  std::vector<std::string> addresses;  // IPv4/IPv6 addresses of a net device
};

struct TopologyEntry {
  std::vector<std::string> preferred;
  std::vector<std::string> fallback;
};

class Topology {
 public:
  // Weight of a device for a location: 1.0 preferred, 0.5 fallback, 0.25 when the device is unknown
  // to the matrix (still usable).
  static constexpr double kPreferredWeight = 1.0;
  static constexpr double kFallbackWeight = 0.5;
  static constexpr double kUnknownWeight = 0.25;

  // Reads sysfs under sysfs_root and the interface addresses (getifaddrs). Never fails on a missing
  // file (a host without NUMA info gets one location "cpu:0"); fails only when sysfs_root is unreadable.
  static Result<Topology> discover(const std::string& sysfs_root = "/sys");
  static Result<Topology> parse_json(std::string_view json_text, std::string_view what = "topology");
  static Result<Topology> load(const std::string& path);

  std::string to_json(int indent = 2) const;

  double weight(std::string_view location, std::string_view device) const;
  // The net device holding IP address `address` ("127.0.0.2" -> "lo"); "" when none.
  std::string device_of_address(std::string_view address) const;

  const std::vector<TopologyDevice>& devices() const { return devices_; }
  const std::map<std::string, TopologyEntry>& matrix() const { return matrix_; }

 private:
  std::vector<TopologyDevice> devices_;
  std::map<std::string, TopologyEntry> matrix_;
};

}  // namespace mc::transfer
