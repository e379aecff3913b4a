// Conversions between the master core's values and their wire form (protocol.hpp). Internal to mc_store.
#pragma once

#include "mc/proto/store.hpp"
#include "mc/store/master_core.hpp"

namespace mc::store {

inline proto::StoreReplica to_wire(const ReplicaView& v) {
  proto::StoreReplica r;
  r.segment = v.segment.name;
  r.node_id = v.segment.node_id;
  r.host = v.segment.host;
  r.domain = v.segment.domain;
  r.medium = std::string(medium_name(v.segment.medium));
  r.endpoint = v.segment.endpoint;
  r.xfer_segment = v.segment.xfer_segment;
  r.xfer_offset_bytes = v.segment.xfer_segment.empty() ? 0 : v.segment.xfer_base_offset + v.offset;
  r.offset_bytes = v.offset;
  r.size_bytes = v.size_bytes;
  return r;
}

inline proto::StoreDemoteTask to_wire(const DemoteTask& t) {
  return proto::StoreDemoteTask{t.task_id,     t.key,        t.src_segment, t.src_offset,
                                t.dst_segment, t.dst_offset, t.size_bytes,  t.checksum};
}

inline proto::StoreDrainTask to_wire(const DrainTask& t) {
  return proto::StoreDrainTask{t.key,      t.src_segment, t.src_offset,     t.size_bytes,
                               t.checksum, t.put_id,      to_wire(t.target)};
}

}  // namespace mc::store
