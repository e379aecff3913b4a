// MasterCore (master_core.hpp): the durable metadata (DESIGN.md §17). The class is split across master_*.cpp by its
// header's paragraphs.
#include "mc/store/master_core.hpp"

#include <algorithm>
#include <set>
#include <tuple>

#include "master_core_internal.hpp"
#include "mc/common/log.hpp"
#include "mc/store/checksum.hpp"

namespace mc::store {

// ---------------------------------------------------------------------------------------------
// Durable metadata (DESIGN.md §17)
// ---------------------------------------------------------------------------------------------

std::optional<DurableObject> MasterCore::durable_object(const std::string& key, const Object& obj) const {
  DurableObject d;
  d.key = key;
  d.size_bytes = obj.size_bytes;
  d.checksum = obj.checksum;
  d.part_bytes = obj.part_bytes;
  d.part_checksums = obj.part_checksums;
  d.complete = obj.complete;
  d.owner = obj.owner;
  d.pinned = obj.pinned;  // a soft pin that ran out stays until pin_holds() ends it (and marks the key)
  if (d.pinned && obj.pin_until_ns != 0) {
    d.pin_left_ms = std::max<int64_t>(1, (obj.pin_until_ns - clock_->now_ns() + kNsPerMs - 1) / kNsPerMs);
  }
  for (const Replica& r : obj.replicas) d.replicas.push_back({r.segment, r.offset, r.complete});
  return d;
}

DurableChanges MasterCore::take_durable_changes() {
  DurableChanges out;
  for (const std::string& name : dirty_segments_) {
    auto seg = segments_.find(name);
    if (seg == segments_.end()) {
      out.segments.emplace_back(name, std::nullopt);
    } else {
      out.segments.emplace_back(name, DurableSegment{seg->second.info, seg->second.read_only});
    }
  }
  std::vector<std::string> keys(dirty_keys_.begin(), dirty_keys_.end());
  std::sort(keys.begin(), keys.end());
  for (std::string& key : keys) {
    auto it = objects_.find(key);
    std::optional<DurableObject> d = it == objects_.end() ? std::nullopt : durable_object(key, it->second);
    out.objects.emplace_back(std::move(key), std::move(d));
  }
  dirty_segments_.clear();
  dirty_keys_.clear();
  return out;
}

std::vector<DurableSegment> MasterCore::durable_segments() const {
  std::vector<DurableSegment> out;
  for (const auto& [name, seg] : segments_) out.push_back({seg.info, seg.read_only});
  return out;
}

std::vector<DurableObject> MasterCore::durable_objects() const {
  std::vector<DurableObject> out;
  out.reserve(objects_.size());
  for (const auto& [key, obj] : objects_) {
    if (std::optional<DurableObject> d = durable_object(key, obj)) out.push_back(std::move(*d));
  }
  std::sort(out.begin(), out.end(), [](const DurableObject& a, const DurableObject& b) { return a.key < b.key; });
  return out;
}

Result<DurableLoad> MasterCore::load_durable(const std::vector<DurableSegment>& segments,
                                             const std::vector<DurableObject>& objects) {
  if (!segments_.empty() || !objects_.empty()) {
    return Status(Code::kFailedPrecondition, "load_durable: the master already holds metadata (load into a fresh one)");
  }
  DurableLoad out;
  const auto refuse = [&](const std::string& why) {
    ++out.refused_records;
    if (out.refusals.size() < 8) out.refusals.push_back(why);
  };
  const int64_t now = clock_->now_ns();
  for (const DurableSegment& d : segments) {
    const SegmentInfo& info = d.info;
    if (info.name.empty() || info.node_id.empty() || info.capacity_bytes < config_.alignment_bytes ||
        info.capacity_bytes > kMaxSegmentCapacityBytes || segments_.count(info.name)) {
      refuse("segment record '" + info.name.substr(0, 120) +
             "': no name or node, a capacity below one allocation unit or above 1 PiB, or named twice");
      continue;
    }
    Segment seg;
    seg.info = info;
    seg.alloc = std::make_unique<OffsetAllocator>(info.capacity_bytes, config_.alignment_bytes);
    seg.read_only = d.read_only;
    // Its node may have died during the failover: offered for reads, but nothing new is placed on it until the node
    // heartbeats to this master (a dead one is dropped after node_ttl_ms as usual).
    seg.unconfirmed = true;
    segments_.emplace(info.name, std::move(seg));
    Node& node = nodes_[info.node_id];
    node.last_heartbeat_ns = now;
    node.segments.push_back(info.name);
    ++out.segments;
  }
  const int64_t hold_until = now + std::max<int64_t>(config_.free_delay_ms, 0) * kNsPerMs;
  for (const DurableObject& d : objects) {
    if (!validate_key(d.key).is_ok() || d.size_bytes == 0 || d.size_bytes > config_.max_object_bytes ||
        d.replicas.size() > config_.max_replicas || objects_.count(d.key)) {
      refuse("object record '" + d.key.substr(0, 80) + "': bad key or size, too many replicas, or named twice");
      continue;
    }
    // Every range must lie in a known segment, one per segment, and not overlap what is loaded already.
    bool ok = true;
    std::set<std::string> used;
    for (const DurableReplica& r : d.replicas) {
      auto seg = segments_.find(r.segment);
      if (seg == segments_.end() || r.offset > seg->second.info.capacity_bytes ||
          d.size_bytes > seg->second.info.capacity_bytes - r.offset || !used.insert(r.segment).second) {
        ok = false;
        break;
      }
    }
    std::vector<std::pair<Segment*, uint64_t>> taken;
    for (size_t i = 0; ok && i < d.replicas.size(); ++i) {
      Segment& seg = segments_.at(d.replicas[i].segment);
      if (seg.alloc->allocate_at(d.replicas[i].offset, d.size_bytes).is_ok()) {
        taken.emplace_back(&seg, d.replicas[i].offset);
      } else {
        ok = false;
      }
    }
    if (!ok) {
      for (auto& [seg, offset] : taken) (void)seg->alloc->free(offset);
      refuse("object record '" + d.key.substr(0, 80) +
             "': a replica range lies outside its segment, in an unknown one, "
             "or over another object's");
      continue;
    }
    Object obj;
    obj.size_bytes = d.size_bytes;
    obj.checksum = d.checksum;
    if (d.complete && parts_fit(d.size_bytes, d.part_bytes, d.part_checksums.size())) {
      obj.part_bytes = d.part_bytes;  // parts that do not fit are dropped: ranges of it are then read whole
      obj.part_checksums = d.part_checksums;
    }
    obj.complete = d.complete;
    obj.put_id = next_put_id_++;
    obj.started_ns = obj.last_access_ns = now;
    obj.pinned = d.complete && d.pinned;
    obj.pin_until_ns = obj.pinned && d.pin_left_ms > 0 ? now + d.pin_left_ms * kNsPerMs : 0;
    for (const DurableReplica& r : d.replicas) {
      Segment& seg = segments_.at(r.segment);
      if (d.complete && r.complete) {
        Replica rep;
        rep.segment = r.segment;
        rep.offset = r.offset;
        rep.complete = true;
        rep.started_ns = now;
        obj.replicas.push_back(rep);
        ++seg.replicas;
        ++out.replicas;
      } else {
        // Being written at the old leader: nobody will finish it here; its range is freed after free_delay_ms.
        defer_free({r.segment, r.offset, d.size_bytes, hold_until});
        ++out.held_ranges;
      }
    }
    if (obj.replicas.empty()) continue;  // an unfinished put: only its ranges are held
    if (obj.pinned) pinned_keys_.insert(d.key);
    // Quota usage is derived from the objects: the tenant of a "tenant/T/" key is T, a shared key's the recorded
    // writer; charged for the replicas the record holds.
    obj.owner = key_tenant(d.key);
    if (obj.owner.empty() && d.owner.size() <= 64) obj.owner = d.owner;
    obj.charged_bytes = obj.size_bytes * obj.replicas.size();
    account(obj, +1);
    if (auto [at, added] = objects_.emplace(d.key, std::move(obj)); added) index_add(at);
    ++out.objects;
  }
  return out;
}

}  // namespace mc::store
