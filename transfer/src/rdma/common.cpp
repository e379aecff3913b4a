// Parts of the rdma transport that need no device (built with or without ibverbs): path planning from the
// topology matrices, GID text and selection, MTU and READ-depth negotiation, validation of a peer's QP
// values, the memory-region split.
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>

#include "mc/proto/transfer.hpp"
#include "rdma/rdma.hpp"

namespace mc::transfer::rdma {

std::vector<DevicePair> plan_paths(const Topology& local, const std::vector<std::string>& local_devices,
                                   const std::string& local_location, const Topology& remote,
                                   const std::vector<std::string>& remote_devices, const std::string& remote_location) {
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
    case 256:
      return 1;
    case 512:
      return 2;
    case 1024:
      return 3;
    case 2048:
      return 4;
    case 4096:
      return 5;
    default:
      return 0;
  }
}

std::string no_device_message(bool list_is_null, int errno_value) {
  if (!list_is_null) return kNoDeviceMessage;
  std::string m = std::string("no RDMA device: ibv_get_device_list failed: ") + std::strerror(errno_value);
  if (errno_value == ENOSYS || errno_value == EPROTONOSUPPORT) {
    m += " (no RDMA support in this kernel: no ib_uverbs module, or no RDMA device at all)";
  }
  return m;
}

namespace {

bool gid_zero(const uint8_t (&g)[16]) {
  return std::all_of(std::begin(g), std::end(g), [](uint8_t b) { return b == 0; });
}
bool gid_ipv4_mapped(const uint8_t (&g)[16]) {
  for (int i = 0; i < 10; ++i) {
    if (g[i] != 0) return false;
  }
  return g[10] == 0xff && g[11] == 0xff;
}
bool gid_link_local(const uint8_t (&g)[16]) { return g[0] == 0xfe && (g[1] & 0xc0) == 0x80; }

const char* gid_type_name(GidType t) {
  switch (t) {
    case GidType::kIb:
      return "IB";
    case GidType::kRoceV1:
      return "RoCE v1";
    case GidType::kRoceV2:
      return "RoCE v2";
  }
  return "?";
}

}  // namespace

Result<uint32_t> choose_gid_index(const std::vector<GidEntry>& entries, bool ethernet, const std::string& override_text,
                                  const std::string& where) {
  auto table = [&] {
    std::string t;
    for (const auto& e : entries) {
      if (gid_zero(e.raw)) continue;
      t += (t.empty() ? "" : ", ") + std::to_string(e.index) + ":" + gid_type_name(e.type) + ":" + gid_to_hex(e.raw);
    }
    return t.empty() ? std::string("no non-zero entry") : t;
  };
  if (!override_text.empty()) {
    uint32_t idx = 0;
    const char* end = override_text.data() + override_text.size();
    auto [p, ec] = std::from_chars(override_text.data(), end, idx);
    if (ec != std::errc() || p != end) {
      return Status(Code::kInvalidArgument,
                    where + ": MC_RDMA_GID_INDEX='" + override_text + "' is not a GID table index (a decimal number)");
    }
    for (const auto& e : entries) {
      if (e.index == idx && !gid_zero(e.raw)) return idx;
    }
    return Status(Code::kInvalidArgument, where + ": MC_RDMA_GID_INDEX=" + override_text +
                                              " names no non-zero GID of the port (its table: " + table() + ")");
  }
  if (!ethernet) {
    for (const auto& e : entries) {
      if (e.type == GidType::kIb && !gid_zero(e.raw)) return e.index;
    }
    return Status(Code::kNoPath, where + ": InfiniBand port without a GID (its table: " + table() + ")");
  }
  // RoCE: rank the v2 entries (0 = IPv4-mapped, 1 = global IPv6, 2 = link-local), lowest rank then index.
  const GidEntry* best = nullptr;
  int best_rank = 3;
  for (const auto& e : entries) {
    if (e.type != GidType::kRoceV2 || gid_zero(e.raw)) continue;
    const int rank = gid_ipv4_mapped(e.raw) ? 0 : (gid_link_local(e.raw) ? 2 : 1);
    if (rank < best_rank || (rank == best_rank && e.index < best->index)) {
      best = &e;
      best_rank = rank;
    }
  }
  if (best == nullptr) {
    return Status(Code::kNoPath, where + ": no RoCE v2 GID in its table (" + table() +
                                     "); give the interface an IP address, or set MC_RDMA_GID_INDEX (see `show_gids`)");
  }
  return best->index;
}

Status validate_peer_qp(const proto::RdmaQpInfo& peer, bool local_ethernet, const std::string& what) {
  auto bad = [&](const std::string& m) { return Status(Code::kInvalidArgument, what + ": peer QP info: " + m); };
  if (peer.qp_num < 2 || peer.qp_num > 0xFFFFFFu) {
    return bad("qp_num " + std::to_string(peer.qp_num) + " is not an RC queue pair number (2 .. 2^24-1)");
  }
  if (peer.psn > 0xFFFFFFu) return bad("psn " + std::to_string(peer.psn) + " does not fit 24 bits");
  if (mtu_enum(peer.mtu_bytes) == 0) {
    return bad("MTU " + std::to_string(peer.mtu_bytes) + " bytes is not one of 256, 512, 1024, 2048, 4096");
  }
  if (peer.lid > 0xFFFFu) return bad("LID " + std::to_string(peer.lid) + " does not fit 16 bits");
  uint8_t g[16];
  if (Status st = gid_from_hex(peer.gid, g); !st.is_ok()) return bad(st.message());
  if (local_ethernet && peer.lid != 0) {
    return bad("LID " + std::to_string(peer.lid) +
               ": an InfiniBand port, but this port is Ethernet (RoCE); the "
               "link layers must match");
  }
  if (local_ethernet && gid_zero(g)) return bad("zero GID, but RoCE addresses a peer by its GID");
  if (!local_ethernet && peer.lid == 0 && gid_zero(g)) return bad("neither a LID nor a GID");
  return Status::ok();
}

uint8_t negotiate_rd_atomic(int64_t initiator_offer, int64_t target_limit) {
  return static_cast<uint8_t>(std::clamp<int64_t>(std::min(initiator_offer, target_limit), 1, 255));
}

int negotiate_mtu(int local_active_mtu_enum, uint32_t peer_mtu_bytes) {
  const int peer = mtu_enum(peer_mtu_bytes);
  if (peer == 0 || local_active_mtu_enum < 1 || local_active_mtu_enum > 5) return 0;
  return std::min(peer, local_active_mtu_enum);
}

std::vector<std::pair<uint64_t, uint64_t>> split_registration(uint64_t length, uint64_t chunk_bytes,
                                                              uint64_t max_region_bytes) {
  const uint64_t chunk = std::clamp<uint64_t>(chunk_bytes, 1, std::max<uint64_t>(1, max_region_bytes));
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (uint64_t off = 0; off < length; off += std::min(chunk, length - off)) {
    out.emplace_back(off, std::min(chunk, length - off));
  }
  return out;
}

std::string reg_mr_remedy(int err, uint64_t memlock_limit_bytes) {
  if (err != ENOMEM && err != EPERM) return "";
  const std::string limit =
      memlock_limit_bytes == UINT64_MAX ? std::string("unlimited") : std::to_string(memlock_limit_bytes) + " bytes";
  return " (pinned memory is limited by RLIMIT_MEMLOCK, now " + limit +
         ": raise it with `ulimit -l unlimited`, LimitMEMLOCK=infinity in a systemd unit, or "
         "`--ulimit memlock=-1` for a container; or register less)";
}

}  // namespace mc::transfer::rdma
