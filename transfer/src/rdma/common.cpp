// Parts of the rdma transport that need no device (built with or without ibverbs): path planning from the
// topology matrices, GID text, MTU values.
#include <algorithm>
#include <cstdio>

#include "rdma/rdma.hpp"

namespace mc::transfer::rdma {

std::vector<DevicePair> plan_paths(const Topology& local, const std::vector<std::string>& local_devices,
                                   const std::string& local_location, const Topology& remote,
                                   const std::vector<std::string>& remote_devices,
                                   const std::string& remote_location) {
  std::vector<DevicePair> out;
  for (const auto& ld : local_devices) {
    for (size_t ri = 0; ri < remote_devices.size(); ++ri) {
      DevicePair p;
      p.local_device = ld;
      p.remote_index = ri;
      p.weight = local.weight(local_location, ld) * remote.weight(remote_location, remote_devices[ri]);
      out.push_back(std::move(p));
    }
  }
  std::stable_sort(out.begin(), out.end(), [&](const DevicePair& a, const DevicePair& b) {
    if (a.weight != b.weight) return a.weight > b.weight;
    if (a.local_device != b.local_device) return a.local_device < b.local_device;
    return a.remote_index < b.remote_index;
  });
  if (!out.empty()) {
    // Pairs far below the best (a device on the wrong socket on both sides) are dropped: they would only
    // steal slices from the close ones. They come back as fallback only when nothing better exists.
    const double best = out.front().weight;
    std::erase_if(out, [&](const DevicePair& p) { return p.weight < best * Topology::kFallbackWeight; });
  }
  return out;
}

std::string gid_to_hex(const uint8_t (&raw)[16]) {
  std::string s;
  char b[3];
  for (uint8_t v : raw) {
    std::snprintf(b, sizeof b, "%02x", v);
    s += b;
  }
  return s;
}

Status gid_from_hex(const std::string& hex, uint8_t (&raw)[16]) {
  if (hex.size() != 32) {
    return Status(Code::kInvalidArgument, "GID '" + hex + "': want 32 hex digits, got " + std::to_string(hex.size()));
  }
  auto nib = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < 16; ++i) {
    const int h = nib(hex[2 * i]);
    const int l = nib(hex[2 * i + 1]);
    if (h < 0 || l < 0) return Status(Code::kInvalidArgument, "GID '" + hex + "': not hexadecimal");
    raw[i] = static_cast<uint8_t>(h * 16 + l);
  }
  return Status::ok();
}

int mtu_enum(uint32_t mtu_bytes) {
  switch (mtu_bytes) {
    case 256: return 1;
    case 512: return 2;
    case 1024: return 3;
    case 2048: return 4;
    case 4096: return 5;
    default: return 0;
  }
}

}  // namespace mc::transfer::rdma
