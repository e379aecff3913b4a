// The store master as the transfer engine's segment directory (Mooncake §5: the metadata service that
// tells a peer how to reach a segment).
//
// Storage nodes create their TransferEngine with a MasterSegmentDirectory: registering the DRAM pool
// publishes the engine's descriptor (xfer.publish_segment), and the node publishes it again on every
// mount. Clients create theirs with one too: open_segment(name) looks the descriptor up at the master
// (xfer.get_segment) instead of asking the peer. The master keeps one descriptor per segment name
// (the newest publish wins) and forgets a descriptor once no mounted store segment refers to it any more
// (its node unmounted or was declared dead), so a lookup of a dead node's segment is kNotFound.
//
// SegmentRegistry is the master's side (pure: no sockets); MasterSegmentDirectory the engine's side.
// Errors: kProtocolMismatch for a descriptor whose format_version is not proto::kSegmentDescriptorVersion
// (checked on publish by the master and on lookup by the client); kInvalidArgument for an empty name or
// overlapping / unsorted regions; kNotFound naming the segment; the RPC's kUnavailable/kTimeout naming the
// master endpoint.
// Thread-safety: MasterSegmentDirectory may be called from any thread (one RPC connection behind a mutex);
// SegmentRegistry is not thread-safe (the master's RPC thread owns it).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "mc/common/status.hpp"
#include "mc/coord/etcd.hpp"
#include "mc/net/rpc.hpp"
#include "mc/proto/transfer.hpp"
#include "mc/store/master_link.hpp"
#include "mc/transfer/engine.hpp"

namespace mc::store {

// Bounds of a descriptor a directory accepts (a peer's input: a publish, or an etcd record).
inline constexpr size_t kMaxDescriptorNameBytes = 1024;
inline constexpr size_t kMaxDescriptorRegions = 4096;
inline constexpr size_t kMaxDescriptorEndpoints = 64;           // endpoints, and RDMA devices
inline constexpr uint64_t kMaxRegionBytes = uint64_t{1} << 50;  // 1 PiB

// Checks what a directory accepts: known format version, a name, disjoint regions sorted by offset, and the bounds
// above (kInvalidArgument naming the descriptor and the bound).
Status validate_descriptor(const proto::SegmentDescriptor& descriptor);

class SegmentRegistry {
 public:
  // Stores (or replaces) the descriptor under its name; returns the number of regions accepted.
  Result<uint64_t> publish(const proto::SegmentDescriptor& descriptor);
  Result<proto::SegmentDescriptor> lookup(const std::string& name) const;
  // Called with the xfer segment names that mounted store segments refer to now. A descriptor that was
  // referred to before and is not any more (its node is gone) is dropped; descriptors never referred
  // to (other engines using the master as directory) stay until replaced. Returns the names dropped.
  std::set<std::string> retain_bound(const std::set<std::string>& referenced);
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    proto::SegmentDescriptor descriptor;
    bool bound = false;  // some mounted store segment referred to it
  };
  std::map<std::string, Entry> entries_;
};

class MasterSegmentDirectory final : public transfer::SegmentDirectory {
 public:
  // Connects to the master (hello handshake); client_name appears in the master's logs.
  static Result<std::shared_ptr<MasterSegmentDirectory>> connect(const std::string& master_endpoint,
                                                                 const std::string& client_name,
                                                                 int64_t rpc_timeout_ms);
  // The same, following the leader of a replicated master (master_link.hpp).
  static Result<std::shared_ptr<MasterSegmentDirectory>> connect(std::shared_ptr<MasterLocator> locator,
                                                                 const std::string& client_name,
                                                                 int64_t rpc_timeout_ms);
  Result<proto::SegmentDescriptor> lookup(const std::string& name, int64_t timeout_ms) override;
  // An initiator-only engine (empty name) serves nothing: nothing is published.
  Status publish(const proto::SegmentDescriptor& descriptor) override;

 private:
  MasterSegmentDirectory() = default;
  std::mutex mu_;
  std::unique_ptr<MasterLink> master_;
  int64_t rpc_timeout_ms_ = 2000;
};

// With a replicated master (DESIGN.md §17) the descriptors are etcd records too (/mc/<cluster>/xseg/<name>, written by
// the leader as it accepts publishes and drops dead nodes' descriptors): EtcdSegmentDirectory looks a segment up in
// etcd directly, so a transfer engine finds its peers without asking the master (also while no master leads), and
// asks the master only when etcd does not answer. Publishing still goes through the master, which checks claims and
// keeps the records. Errors: lookup's kNotFound naming the segment and the cluster, kProtocolMismatch /
// kMalformedMessage for a record that is not a valid descriptor.
// Thread-safety: any thread (the etcd client is thread-safe; the master directory has its own mutex).
class EtcdSegmentDirectory final : public transfer::SegmentDirectory {
 public:
  static Result<std::shared_ptr<EtcdSegmentDirectory>> connect(std::shared_ptr<MasterLocator> locator,
                                                               const MasterAddress& address,
                                                               const std::string& client_name, int64_t rpc_timeout_ms);
  Result<proto::SegmentDescriptor> lookup(const std::string& name, int64_t timeout_ms) override;
  Status publish(const proto::SegmentDescriptor& descriptor) override;
  uint64_t etcd_lookups() const { return etcd_lookups_.load(); }  // answered from etcd

 private:
  EtcdSegmentDirectory() = default;
  // The master's directory, connected at its first use (publish, or a lookup while etcd does not answer), so that
  // lookups work while no master answers.
  Result<std::shared_ptr<MasterSegmentDirectory>> master();
  std::mutex master_mu_;
  std::shared_ptr<MasterLocator> locator_;
  std::string client_name_;
  int64_t rpc_timeout_ms_ = 2000;
  std::shared_ptr<MasterSegmentDirectory> master_;
  std::unique_ptr<etcd::Client> etcd_;
  std::string cluster_id_;
  std::atomic<uint64_t> etcd_lookups_{0};
};

// The directory a store client or node uses: the master's, or with etcd (address.etcd) the etcd records'.
Result<std::shared_ptr<transfer::SegmentDirectory>> connect_segment_directory(std::shared_ptr<MasterLocator> locator,
                                                                              const MasterAddress& address,
                                                                              const std::string& client_name,
                                                                              int64_t rpc_timeout_ms);

}  // namespace mc::store
