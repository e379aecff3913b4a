// MasterCore (master_core.hpp): segments and storage nodes: mount, unmount, heartbeats, reports, demotion. The class is
// split across master_*.cpp by its header's paragraphs.
#include "mc/store/master_core.hpp"

#include <algorithm>
#include <set>
#include <tuple>

#include "master_core_internal.hpp"
#include "mc/common/log.hpp"

namespace mc::store {

// ---------------------------------------------------------------------------------------------
// Segments and nodes
// ---------------------------------------------------------------------------------------------

Status MasterCore::mount_segment(const SegmentInfo& info, bool restore) {
  if (info.name.empty() || info.node_id.empty()) {
    return Status(Code::kInvalidArgument, "mount: segment name and node id must be set");
  }
  if (info.capacity_bytes < config_.alignment_bytes) {
    return Status(Code::kInvalidArgument, "mount: segment '" + info.name + "' capacity of " +
                                              std::to_string(info.capacity_bytes) +
                                              " bytes is below one allocation unit");
  }
  if (info.capacity_bytes > kMaxSegmentCapacityBytes) {
    return Status(Code::kInvalidArgument, "mount: segment '" + info.name + "' capacity of " +
                                              std::to_string(info.capacity_bytes) + " bytes is above the limit of " +
                                              std::to_string(kMaxSegmentCapacityBytes) + " (1 PiB)");
  }
  auto existing = segments_.find(info.name);
  if (existing != segments_.end()) {
    if (existing->second.info.node_id != info.node_id) {
      return Status(Code::kAlreadyExists, "mount: segment '" + info.name + "' is already mounted by node '" +
                                              existing->second.info.node_id + "'");
    }
    MC_LOG_INFO << "segment " << info.name << " re-mounted by " << info.node_id << ": its old replicas are dropped";
    drop_segment(info.name);
  }
  auto known = nodes_.find(info.node_id);
  if (known != nodes_.end() && (known->second.suspect || known->second.reporting)) {
    // A suspect node that mounts again was restarted: whatever it held (DRAM and SSD alike) is gone.
    MC_LOG_INFO << "suspect node " << info.node_id << " mounts again (restarted): its old segments are dropped";
    std::vector<std::string> old = known->second.segments;
    for (const std::string& name : old) drop_segment(name);
    known->second.segments.clear();
    known->second.journal.clear();
    known->second.suspect = known->second.reporting = false;
  }
  if (known != nodes_.end() && known->second.draining) {
    // A draining node that mounts again was restarted (or gave up its drain): it serves as a normal node.
    MC_LOG_INFO << "draining node " << info.node_id << " mounts " << info.name << " again: its drain ends";
    Node& n = known->second;
    n.draining = false;
    n.drain_queue.clear();
    n.drain_inflight.clear();
    n.drain_skip.clear();
    for (const std::string& name : n.segments) {
      auto s = segments_.find(name);
      if (s != segments_.end()) s->second.draining = false;
    }
  }
  Segment seg;
  seg.info = info;
  seg.alloc = std::make_unique<OffsetAllocator>(info.capacity_bytes, config_.alignment_bytes);
  seg.restoring = restore;
  seg.offline = restore;
  segments_.emplace(info.name, std::move(seg));
  dirty_segment(info.name);
  Node& node = nodes_[info.node_id];
  node.last_heartbeat_ns = clock_->now_ns();
  if (std::find(node.segments.begin(), node.segments.end(), info.name) == node.segments.end()) {
    node.segments.push_back(info.name);
  }
  return Status::ok();
}

Status MasterCore::unmount_segment(const std::string& node_id, const std::string& segment) {
  auto it = segments_.find(segment);
  if (it == segments_.end() || it->second.info.node_id != node_id) {
    return Status(Code::kNotFound, "unmount: node '" + node_id + "' has no segment '" + segment + "'");
  }
  const uint64_t lost = drop_segment(segment);
  auto node = nodes_.find(node_id);
  if (node != nodes_.end()) {
    Node& n = node->second;
    if (n.draining) {
      // What a drain could not move (timeout, failed copies) leaves with the segment: counted as dropped.
      n.drain_dropped += lost;
      counters_.drain_dropped_objects += lost;
    }
    auto& segs = n.segments;
    segs.erase(std::remove(segs.begin(), segs.end(), segment), segs.end());
    if (segs.empty()) {
      if (n.draining) {
        ++counters_.nodes_drained;
        MC_LOG_INFO << "storage node " << node_id << " drained and left: " << n.drain_moved << " objects moved, "
                    << n.drain_dropped << " dropped";
      }
      nodes_.erase(node);
    }
  }
  return Status::ok();
}

uint64_t MasterCore::drop_segment(const std::string& segment) {
  // Every replica on the segment leaves the metadata; objects left with no complete replica go too.
  uint64_t lost = 0;
  for (auto it = objects_.begin(); it != objects_.end();) {
    Object& obj = it->second;
    auto& reps = obj.replicas;
    auto keep_end = std::remove_if(reps.begin(), reps.end(), [&](const Replica& r) { return r.segment == segment; });
    bool touched = keep_end != reps.end();
    for (auto r = keep_end; r != reps.end(); ++r) {
      if (r->demote_task) demotions_.erase(r->demote_task);
    }
    reps.erase(keep_end, reps.end());
    if (touched) {
      dirty(it->first);
      // A demotion whose source vanished cannot finish: drop its target replica too.
      for (auto r = reps.begin(); r != reps.end();) {
        if (r->demote_task && !demotions_.count(r->demote_task)) {
          release_replica(*r, obj.size_bytes, false);
          r = reps.erase(r);
        } else {
          ++r;
        }
      }
      bool any_complete = std::any_of(reps.begin(), reps.end(), [](const Replica& r) { return r.complete; });
      if (obj.complete && !any_complete) {
        for (const Replica& r : reps) release_replica(r, obj.size_bytes, true);
        account(obj, -1);
        index_drop(it);
        it = objects_.erase(it);
        ++lost;
        continue;
      }
      if (!obj.complete && reps.empty()) {
        account(obj, -1);
        index_drop(it);
        it = objects_.erase(it);
        continue;
      }
    }
    ++it;
  }
  pending_frees_.erase(std::remove_if(pending_frees_.begin(), pending_frees_.end(),
                                      [&](const PendingFree& p) { return p.segment == segment; }),
                       pending_frees_.end());
  std::make_heap(pending_frees_.begin(), pending_frees_.end(), ReleasesLater{});
  pending_free_bytes_ = 0;
  for (const PendingFree& p : pending_frees_) pending_free_bytes_ += p.size_bytes;
  for (auto t = demotions_.begin(); t != demotions_.end();) {
    auto obj = objects_.find(t->second.second);
    bool alive = obj != objects_.end() && std::any_of(obj->second.replicas.begin(), obj->second.replicas.end(),
                                                      [&](const Replica& r) { return r.demote_task == t->first; });
    t = alive ? std::next(t) : demotions_.erase(t);
  }
  auto seg = segments_.find(segment);
  if (seg != segments_.end()) {
    proto::KvEvent e;
    e.type = proto::kKvEventCleared;
    e.ts_unix_ms = unix_time_ms();
    e.backend_id = segment;
    e.medium = std::string(medium_name(seg->second.info.medium));
    events_.push_back(std::move(e));
    auto node = nodes_.find(seg->second.info.node_id);
    if (node != nodes_.end()) {
      auto& changes = node->second.journal;
      changes.erase(std::remove_if(changes.begin(), changes.end(),
                                   [&](const proto::StoreNodeObjectChange& c) { return c.segment == segment; }),
                    changes.end());
      auto& tasks = node->second.tasks;
      tasks.erase(
          std::remove_if(tasks.begin(), tasks.end(),
                         [&](const DemoteTask& t) { return t.src_segment == segment || t.dst_segment == segment; }),
          tasks.end());
    }
    segments_.erase(seg);
    dirty_segment(segment);
  }
  return lost;
}

void MasterCore::drop_node(const std::string& node_id) {
  auto node = nodes_.find(node_id);
  if (node == nodes_.end()) return;
  std::vector<std::string> segs = node->second.segments;
  for (const std::string& s : segs) drop_segment(s);
  nodes_.erase(node_id);
  ++counters_.dead_nodes;
}

Result<NodeBeat> MasterCore::node_heartbeat(const std::string& node_id) {
  auto node = nodes_.find(node_id);
  if (node == nodes_.end()) {
    return Status(Code::kNotFound,
                  "node '" + node_id + "' is not known to the master (declared dead or never mounted): mount again");
  }
  Node& n = node->second;
  const int64_t now = clock_->now_ns();
  if (n.suspect) {
    MC_LOG_INFO << "suspect storage node " << node_id << " is back after " << (now - n.last_heartbeat_ns) / kNsPerMs
                << " ms of silence: asking it to re-report its objects";
    n.suspect = false;
    n.reporting = true;
    n.reported_segments.clear();
  }
  n.last_heartbeat_ns = now;
  for (const std::string& name : n.segments) {
    auto seg = segments_.find(name);
    if (seg != segments_.end() && seg->second.unconfirmed) {
      seg->second.unconfirmed = false;
      MC_LOG_INFO << "storage node " << node_id << " confirmed segment " << name << " to this master: offered again";
    }
  }
  NodeBeat beat;
  beat.tasks.assign(n.tasks.begin(), n.tasks.end());
  n.tasks.clear();
  const size_t take = std::min<size_t>(n.journal.size(), proto::kStoreMaxBatch);
  beat.changes.assign(std::make_move_iterator(n.journal.begin()),
                      std::make_move_iterator(n.journal.begin() + static_cast<std::ptrdiff_t>(take)));
  n.journal.erase(n.journal.begin(), n.journal.begin() + static_cast<std::ptrdiff_t>(take));
  beat.more = !n.journal.empty();
  beat.report = n.reporting;
  return beat;
}

Result<proto::StoreNodeReportReply> MasterCore::node_report(const std::string& node_id, const std::string& segment,
                                                            const std::vector<proto::StoreNodeObject>& objects,
                                                            bool first, bool last) {
  auto node = nodes_.find(node_id);
  auto seg_it = segments_.find(segment);
  if (node == nodes_.end() || seg_it == segments_.end() || seg_it->second.info.node_id != node_id) {
    return Status(Code::kNotFound, "node_report: node '" + node_id + "' has no segment '" + segment +
                                       "' at this master: mount it first");
  }
  Segment& seg = seg_it->second;
  for (const proto::StoreNodeObject& o : objects) {
    MC_RETURN_IF_ERROR(validate_key(o.key).with_context("node_report of " + segment));
    if (o.size_bytes == 0 || o.size_bytes > config_.max_object_bytes || o.offset_bytes > seg.info.capacity_bytes ||
        o.size_bytes > seg.info.capacity_bytes - o.offset_bytes) {
      return Status(Code::kInvalidArgument, "node_report of " + segment + ": object '" + o.key + "' of " +
                                                std::to_string(o.size_bytes) + " bytes at offset " +
                                                std::to_string(o.offset_bytes) + " does not fit the segment");
    }
  }
  if (first) {
    seg.reported.clear();
    seg.report_open = true;
  }
  if (!seg.report_open) {
    return Status(Code::kFailedPrecondition,
                  "node_report of " + segment + ": no report round is open (send a page with first)");
  }
  proto::StoreNodeReportReply reply;
  const int64_t now = clock_->now_ns();
  for (const proto::StoreNodeObject& o : objects) {
    // A complete replica of `o` at its reported offset, announced as stored.
    const auto add_restored = [&](Object& obj) {
      Replica nr;
      nr.segment = segment;
      nr.offset = o.offset_bytes;
      nr.complete = true;
      nr.started_ns = now;
      obj.replicas.push_back(nr);
      ++seg.replicas;
      dirty(o.key);
      emit(proto::kKvEventStored, o.key, segment);
    };
    auto it = objects_.find(o.key);
    bool ok = false;
    if (it != objects_.end()) {
      Object& obj = it->second;
      auto r = std::find_if(obj.replicas.begin(), obj.replicas.end(),
                            [&](const Replica& x) { return x.segment == segment && x.offset == o.offset_bytes; });
      const bool same = obj.complete && obj.size_bytes == o.size_bytes && obj.checksum == o.checksum;
      if (r != obj.replicas.end()) {
        ok = same && r->complete;
      } else if (same && seg.restoring && obj.replicas.size() < config_.max_replicas &&
                 std::none_of(obj.replicas.begin(), obj.replicas.end(),
                              [&](const Replica& x) { return segments_.at(x.segment).info.node_id == node_id; }) &&
                 seg.alloc->allocate_at(o.offset_bytes, o.size_bytes).is_ok()) {
        add_restored(obj);
        ok = true;
      }
    } else if (seg.restoring && seg.alloc->allocate_at(o.offset_bytes, o.size_bytes).is_ok()) {
      Object obj;
      obj.size_bytes = o.size_bytes;
      obj.checksum = o.checksum;
      obj.complete = true;
      obj.put_id = next_put_id_++;
      obj.started_ns = obj.last_access_ns = now;
      add_restored(obj);
      obj.owner = key_tenant(o.key);  // a shared key's writer is not in the node's report: not charged
      obj.charged_bytes = obj.size_bytes;
      account(obj, +1);
      if (auto [at, added] = objects_.emplace(o.key, std::move(obj)); added) index_add(at);
      ok = true;
    }
    if (ok) {
      seg.reported.insert(o.offset_bytes);
      ++reply.accepted;
    } else {
      reply.refused_offsets.push_back(o.offset_bytes);
    }
  }
  counters_.reported_replicas += reply.accepted;
  counters_.refused_reports += reply.refused_offsets.size();
  if (!last) return reply;
  // The round is complete: replicas of this segment that the node did not confirm are gone.
  uint64_t dropped = 0;
  for (auto it = objects_.begin(); it != objects_.end();) {
    auto next = std::next(it);  // drop_replica may erase `it` (only it)
    for (size_t i = 0; i < it->second.replicas.size();) {
      const Replica& r = it->second.replicas[i];
      if (r.segment == segment && r.complete && !seg.reported.count(r.offset)) {
        ++dropped;
        if (drop_replica(it, i)) break;
        continue;
      }
      ++i;
    }
    it = next;
  }
  seg.report_open = false;
  seg.restoring = false;
  seg.reported.clear();
  MC_LOG_INFO << "segment " << segment << " of node " << node_id << " re-reported: " << reply.accepted
              << " replicas in the last page, " << dropped << " unconfirmed replicas dropped";
  Node& n = node->second;
  n.reported_segments.insert(segment);
  const bool all = std::all_of(n.segments.begin(), n.segments.end(),
                               [&](const std::string& name) { return n.reported_segments.count(name) > 0; });
  if (n.reporting && all) {
    n.reporting = false;
    set_offline(n, false);
    ++counters_.returned_nodes;
    MC_LOG_INFO << "storage node " << node_id << " re-reported every segment: its replicas are offered again";
  } else if (!n.reporting && !n.suspect) {
    seg.offline = false;  // a restored segment (master restart)
  }
  return reply;
}

Status MasterCore::report_corrupt(const std::string& key, const std::string& segment, uint64_t offset) {
  MC_RETURN_IF_ERROR(validate_key(key));
  auto it = objects_.find(key);
  if (it != objects_.end()) {
    auto& reps = it->second.replicas;
    for (size_t i = 0; i < reps.size(); ++i) {
      if (reps[i].segment != segment || reps[i].offset != offset || !reps[i].complete) continue;
      MC_LOG_WARN << "replica of '" << key << "' on " << segment << " at offset " << offset
                  << " failed its checksum: dropped";
      ++counters_.corrupt_replicas;
      drop_replica(it, i);
      return Status::ok();
    }
  }
  return Status(Code::kObjectNotFound, "report_corrupt: object '" + key + "' has no complete replica on " + segment +
                                           " at offset " + std::to_string(offset) + " (already dropped?)");
}

Status MasterCore::demote_done(const std::string& node_id, uint64_t task_id, bool ok, Code code,
                               const std::string& message) {
  auto t = demotions_.find(task_id);
  if (t == demotions_.end() || t->second.first != node_id) {
    return Status(Code::kNotFound,
                  "demotion task " + std::to_string(task_id) + " of node '" + node_id + "' is not pending");
  }
  std::string key = t->second.second;
  demotions_.erase(t);
  auto it = objects_.find(key);
  if (it == objects_.end()) return Status::ok();
  dirty(key);
  Object& obj = it->second;
  auto dst = std::find_if(obj.replicas.begin(), obj.replicas.end(),
                          [&](const Replica& r) { return r.demote_task == task_id; });
  if (dst == obj.replicas.end()) return Status::ok();
  if (!ok) {
    const std::string dst_segment = dst->segment;
    release_replica(*dst, obj.size_bytes, false);
    obj.replicas.erase(dst);
    auto dseg = segments_.find(dst_segment);
    if ((code == Code::kNoSpace || code == Code::kIo) && dseg != segments_.end() && !dseg->second.read_only) {
      dseg->second.read_only = true;
      dirty_segment(dst_segment);
      ++counters_.ssd_failures;
      MC_LOG_WARN << "SSD segment " << dst_segment << " of node " << node_id
                  << " is read-only from now on: demotion of '" << key << "' failed (" << message
                  << "); DRAM victims are evicted instead";
    }
    if (code == Code::kDataLoss) {
      for (size_t i = 0; i < obj.replicas.size(); ++i) {
        auto s = segments_.find(obj.replicas[i].segment);
        if (s == segments_.end() || s->second.info.node_id != node_id || s->second.info.medium != Medium::kCpu ||
            !obj.replicas[i].complete) {
          continue;
        }
        MC_LOG_WARN << "replica of '" << key << "' on " << s->first << " failed its checksum before demotion: dropped";
        ++counters_.corrupt_replicas;
        drop_replica(it, i);
        break;
      }
    }
    return Status::ok();
  }
  dst->demote_task = 0;
  dst->complete = true;
  std::string dst_segment = dst->segment;
  journal(dst_segment, dst->offset, true, key, &obj);
  emit(proto::kKvEventStored, key, dst_segment);
  // The DRAM source goes, unless it is leased right now (it then stays until a later eviction) or was pinned
  // while the copy ran (a pin keeps its DRAM copy; the SSD one stays as a second replica).
  if (!leased(obj) && !pinned(obj)) {
    auto seg_it = segments_.find(dst_segment);
    std::string node = seg_it == segments_.end() ? "" : seg_it->second.info.node_id;
    for (auto r = obj.replicas.begin(); r != obj.replicas.end(); ++r) {
      auto s = segments_.find(r->segment);
      if (r->complete && s != segments_.end() && s->second.info.node_id == node &&
          s->second.info.medium == Medium::kCpu) {
        ++s->second.demotions;
        ++counters_.demotions;
        emit(proto::kKvEventRemoved, key, r->segment);
        release_replica(*r, obj.size_bytes, false);
        obj.replicas.erase(r);
        break;
      }
    }
  }
  return Status::ok();
}

}  // namespace mc::store
