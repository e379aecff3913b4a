#include "mc/store/directory.hpp"

#include <algorithm>

#include "mc/common/log.hpp"
#include "mc/proto/codec.hpp"
#include "mc/proto/transfer.hpp"
#include "mc/store/master_ha.hpp"

namespace mc::store {

Status validate_descriptor(const proto::SegmentDescriptor& d) {
  if (d.format_version != proto::kSegmentDescriptorVersion) {
    return Status(Code::kProtocolMismatch, "segment descriptor '" + d.name + "' has format version " +
                                               std::to_string(d.format_version) + "; this build reads version " +
                                               std::to_string(proto::kSegmentDescriptorVersion) +
                                               " (upgrade the older side)");
  }
  if (d.name.empty()) return Status(Code::kInvalidArgument, "segment descriptor without a name");
  // Bounds: a descriptor is a peer's input (a publish, an etcd record anyone with etcd access may have written).
  const auto too_many = [&](const char* what, size_t n, size_t most) {
    return Status(Code::kInvalidArgument, "segment descriptor '" + d.name.substr(0, 120) + "': " + std::to_string(n) +
                                              " " + what + ", more than the " + std::to_string(most) + " allowed");
  };
  if (d.name.size() > kMaxDescriptorNameBytes) return too_many("bytes of name", d.name.size(), kMaxDescriptorNameBytes);
  if (d.regions.size() > kMaxDescriptorRegions) return too_many("regions", d.regions.size(), kMaxDescriptorRegions);
  if (d.endpoints.size() > kMaxDescriptorEndpoints) {
    return too_many("endpoints", d.endpoints.size(), kMaxDescriptorEndpoints);
  }
  if (d.rdma_devices.size() > kMaxDescriptorEndpoints) {
    return too_many("RDMA devices", d.rdma_devices.size(), kMaxDescriptorEndpoints);
  }
  uint64_t end = 0;
  for (const auto& r : d.regions) {
    if (r.length_bytes > kMaxRegionBytes) {
      return Status(Code::kInvalidArgument, "segment descriptor '" + d.name.substr(0, 120) + "': region at offset " +
                                                std::to_string(r.segment_offset) + " of " +
                                                std::to_string(r.length_bytes) + " bytes, above the limit of " +
                                                std::to_string(kMaxRegionBytes));
    }
    if (r.segment_offset < end || r.segment_offset + r.length_bytes < r.segment_offset) {
      return Status(Code::kInvalidArgument, "segment descriptor '" + d.name + "': region at offset " +
                                                std::to_string(r.segment_offset) + " overlaps or is out of order");
    }
    end = r.segment_offset + r.length_bytes;
  }
  return Status::ok();
}

Result<uint64_t> SegmentRegistry::publish(const proto::SegmentDescriptor& descriptor) {
  MC_RETURN_IF_ERROR(validate_descriptor(descriptor));
  Entry& e = entries_[descriptor.name];
  e.descriptor = descriptor;
  return static_cast<uint64_t>(descriptor.regions.size());
}

Result<proto::SegmentDescriptor> SegmentRegistry::lookup(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    return Status(Code::kNotFound, "segment " + name +
                                       " is not in the master's directory (its storage node "
                                       "never published it, unmounted or was declared dead)");
  }
  return it->second.descriptor;
}

std::set<std::string> SegmentRegistry::retain_bound(const std::set<std::string>& referenced) {
  std::set<std::string> dropped;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (referenced.count(it->first)) {
      it->second.bound = true;
      ++it;
    } else if (it->second.bound) {
      dropped.insert(it->first);
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  return dropped;
}

Result<std::shared_ptr<MasterSegmentDirectory>> MasterSegmentDirectory::connect(const std::string& master_endpoint,
                                                                                const std::string& client_name,
                                                                                int64_t rpc_timeout_ms) {
  MasterAddress a;
  a.endpoint = master_endpoint;
  MC_ASSIGN_OR_RETURN(std::shared_ptr<MasterLocator> locator, MasterLocator::create(a));
  return connect(std::move(locator), client_name, rpc_timeout_ms);
}

Result<std::shared_ptr<MasterSegmentDirectory>> MasterSegmentDirectory::connect(std::shared_ptr<MasterLocator> locator,
                                                                                const std::string& client_name,
                                                                                int64_t rpc_timeout_ms) {
  std::shared_ptr<MasterSegmentDirectory> d(new MasterSegmentDirectory());
  rpc::ClientOptions co;
  co.client_name = client_name;
  co.connect_timeout_ms = static_cast<int>(rpc_timeout_ms);
  co.default_timeout_ms = static_cast<int>(rpc_timeout_ms);
  MC_ASSIGN_OR_RETURN(d->master_, MasterLink::connect(std::move(locator), co));
  d->rpc_timeout_ms_ = rpc_timeout_ms;
  return d;
}

Result<proto::SegmentDescriptor> MasterSegmentDirectory::lookup(const std::string& name, int64_t timeout_ms) {
  std::lock_guard<std::mutex> lk(mu_);
  auto reply =
      master_->call(proto::GetSegmentRequest{name}, static_cast<int>(timeout_ms > 0 ? timeout_ms : rpc_timeout_ms_));
  if (!reply.is_ok()) return reply.status().with_context("looking up segment " + name + " at " + master_->endpoint());
  MC_RETURN_IF_ERROR(validate_descriptor(reply->descriptor));
  if (reply->descriptor.name != name) {
    return Status(Code::kMalformedMessage, "master " + master_->endpoint() + " answered segment '" +
                                               reply->descriptor.name + "' for a lookup of '" + name + "'");
  }
  return std::move(reply->descriptor);
}

Status MasterSegmentDirectory::publish(const proto::SegmentDescriptor& descriptor) {
  if (descriptor.name.empty()) return Status::ok();
  std::lock_guard<std::mutex> lk(mu_);
  auto reply = master_->call(proto::PublishSegmentRequest{descriptor}, static_cast<int>(rpc_timeout_ms_));
  if (!reply.is_ok()) {
    return reply.status().with_context("publishing segment " + descriptor.name + " at " + master_->endpoint());
  }
  return Status::ok();
}

Result<std::shared_ptr<EtcdSegmentDirectory>> EtcdSegmentDirectory::connect(std::shared_ptr<MasterLocator> locator,
                                                                            const MasterAddress& address,
                                                                            const std::string& client_name,
                                                                            int64_t rpc_timeout_ms) {
  MC_RETURN_IF_ERROR(validate_cluster_id(address.cluster_id));
  MC_ASSIGN_OR_RETURN(etcd::Options eo, etcd::parse_endpoints(address.etcd));
  eo.timeout_ms = std::max<int64_t>(100, std::min<int64_t>(rpc_timeout_ms, 2000));
  std::shared_ptr<EtcdSegmentDirectory> d(new EtcdSegmentDirectory());
  d->locator_ = std::move(locator);
  d->client_name_ = client_name;
  d->rpc_timeout_ms_ = rpc_timeout_ms;
  d->etcd_ = std::make_unique<etcd::Client>(eo);
  d->cluster_id_ = address.cluster_id;
  return d;
}

Result<std::shared_ptr<MasterSegmentDirectory>> EtcdSegmentDirectory::master() {
  std::lock_guard<std::mutex> lock(master_mu_);
  if (!master_) {
    MC_ASSIGN_OR_RETURN(master_, MasterSegmentDirectory::connect(locator_, client_name_, rpc_timeout_ms_));
  }
  return master_;
}

Result<proto::SegmentDescriptor> EtcdSegmentDirectory::lookup(const std::string& name, int64_t timeout_ms) {
  Result<etcd::RangeResult> r = etcd_->range(directory_record_key(cluster_id_, name));
  if (!r.is_ok()) {
    MC_LOG_DEBUG << "segment " << name << ": etcd does not answer (" << r.status().message() << "): asking the master";
    MC_ASSIGN_OR_RETURN(std::shared_ptr<MasterSegmentDirectory> m, master());
    return m->lookup(name, timeout_ms);
  }
  if (r->kvs.empty()) {
    return Status(Code::kNotFound, "segment " + name + " is not in the segment directory of cluster '" + cluster_id_ +
                                       "' in etcd (its node is gone, or never published it)");
  }
  Result<proto::SegmentDescriptor> d =
      codec::unpack<proto::SegmentDescriptor>(r->kvs.front().value, "directory record of " + name);
  Status bad = d.is_ok() ? validate_descriptor(*d) : d.status();
  if (bad.is_ok() && d->name != name) {
    bad = Status(Code::kMalformedMessage,
                 "directory record of segment '" + name + "' in etcd names segment '" + d->name + "'");
  }
  if (!bad.is_ok()) {
    // One bad record costs a round trip to the master (which holds the descriptor it accepted), never the segment.
    MC_LOG_WARN << "segment " << name << ": its etcd record is not a valid descriptor (" << bad.message()
                << "): asking the master";
    MC_ASSIGN_OR_RETURN(std::shared_ptr<MasterSegmentDirectory> m, master());
    return m->lookup(name, timeout_ms);
  }
  etcd_lookups_.fetch_add(1);
  return std::move(d).value();
}

Status EtcdSegmentDirectory::publish(const proto::SegmentDescriptor& descriptor) {
  if (descriptor.name.empty()) return Status::ok();  // an initiator-only engine serves nothing
  MC_ASSIGN_OR_RETURN(std::shared_ptr<MasterSegmentDirectory> m, master());
  return m->publish(descriptor);
}

Result<std::shared_ptr<transfer::SegmentDirectory>> connect_segment_directory(std::shared_ptr<MasterLocator> locator,
                                                                              const MasterAddress& address,
                                                                              const std::string& client_name,
                                                                              int64_t rpc_timeout_ms) {
  if (!address.etcd.empty()) {
    MC_ASSIGN_OR_RETURN(std::shared_ptr<EtcdSegmentDirectory> d,
                        EtcdSegmentDirectory::connect(std::move(locator), address, client_name, rpc_timeout_ms));
    return std::shared_ptr<transfer::SegmentDirectory>(std::move(d));
  }
  MC_ASSIGN_OR_RETURN(std::shared_ptr<MasterSegmentDirectory> d,
                      MasterSegmentDirectory::connect(std::move(locator), client_name, rpc_timeout_ms));
  return std::shared_ptr<transfer::SegmentDirectory>(std::move(d));
}

}  // namespace mc::store
