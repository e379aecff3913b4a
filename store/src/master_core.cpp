#include "mc/store/master_core.hpp"

#include <algorithm>
#include <charconv>
#include <set>
#include <tuple>

#include "mc/common/log.hpp"
#include "mc/store/checksum.hpp"

namespace mc::store {

namespace {
constexpr int64_t kNsPerMs = 1'000'000;
}

std::string_view medium_name(Medium medium) { return medium == Medium::kDisk ? "disk" : "cpu"; }

Result<Medium> parse_medium(std::string_view name) {
  if (name == "cpu" || name == "dram") return Medium::kCpu;
  if (name == "disk" || name == "ssd") return Medium::kDisk;
  return Status(Code::kInvalidArgument, "unknown medium '" + std::string(name) + "' (expected cpu or disk)");
}

std::optional<uint64_t> seq_hash_of_key(std::string_view key) {
  if (key.substr(0, 3) != "kv/") return std::nullopt;
  size_t slash = key.rfind('/');
  if (slash == std::string_view::npos || slash < 3) return std::nullopt;
  std::string_view hex = key.substr(slash + 1);
  if (hex.size() != 16) return std::nullopt;
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), v, 16);
  if (ec != std::errc() || p != hex.data() + hex.size()) return std::nullopt;
  return v;
}

MasterCore::MasterCore(MasterConfig config, const Clock* clock) : config_(config), clock_(clock) {}

Status MasterCore::validate_key(const std::string& key) const {
  if (key.empty()) return Status(Code::kInvalidArgument, "empty object key");
  if (key.size() > config_.max_key_bytes) {
    return Status(Code::kInvalidArgument, "object key of " + std::to_string(key.size()) +
                                              " bytes exceeds the limit of " + std::to_string(config_.max_key_bytes) +
                                              " bytes");
  }
  return Status::ok();
}

bool MasterCore::leased(const Object& obj) const { return obj.lease_until_ns > clock_->now_ns(); }

bool MasterCore::pinned(const Object& obj) const {
  return obj.pinned && (obj.pin_until_ns == 0 || obj.pin_until_ns > clock_->now_ns());
}

bool MasterCore::pin_holds(const std::string& key, Object& obj) {
  if (pinned(obj)) return true;
  if (obj.pinned) {  // a soft pin that ran out: counted once, here or in tick(), whichever sees it first
    dirty(key);
    obj.pinned = false;
    obj.pin_until_ns = 0;
    ++counters_.expired_pins;
  }
  return false;
}

void MasterCore::touch_client(const std::string& client_id) {
  if (!client_id.empty()) clients_[client_id] = clock_->now_ns();
}

void MasterCore::emit(const char* type, const std::string& key, const std::string& segment) {
  std::optional<uint64_t> h = seq_hash_of_key(key);
  if (!h) return;  // only block keys are announced (the index is of prefix hashes)
  auto seg = segments_.find(segment);
  proto::KvEvent e;
  e.type = type;
  e.ts_unix_ms = unix_time_ms();
  e.seq_hashes = {*h};
  e.backend_id = segment;
  e.medium = seg == segments_.end() ? "cpu" : std::string(medium_name(seg->second.info.medium));
  events_.push_back(std::move(e));
}

bool MasterCore::offered(const Replica& r) const {
  if (!r.complete) return false;
  auto seg = segments_.find(r.segment);
  return seg != segments_.end() && !seg->second.offline;
}

bool MasterCore::any_offered(const Object& obj) const {
  return std::any_of(obj.replicas.begin(), obj.replicas.end(), [&](const Replica& r) { return offered(r); });
}

void MasterCore::set_offline(Node& node, bool offline) {
  for (const std::string& name : node.segments) {
    auto seg = segments_.find(name);
    if (seg != segments_.end()) seg->second.offline = offline;
  }
}

void MasterCore::journal(const std::string& segment, uint64_t offset, bool present, const std::string& key,
                         const Object* obj) {
  auto seg = segments_.find(segment);
  if (seg == segments_.end()) return;
  auto node = nodes_.find(seg->second.info.node_id);
  if (node == nodes_.end()) return;
  proto::StoreNodeObjectChange c;
  c.present = present;
  c.segment = segment;
  c.offset_bytes = offset;
  if (present && obj != nullptr) {
    c.key = key;
    c.size_bytes = obj->size_bytes;
    c.checksum = obj->checksum;
  }
  node->second.journal.push_back(std::move(c));
}

bool MasterCore::drop_replica(ObjectMap::iterator it, size_t index) {
  dirty(it->first);
  Object& obj = it->second;
  const Replica r = obj.replicas[index];
  if (r.complete && obj.complete) emit(proto::kKvEventRemoved, it->first, r.segment);
  if (r.demote_task) demotions_.erase(r.demote_task);
  obj.replicas.erase(obj.replicas.begin() + static_cast<std::ptrdiff_t>(index));
  release_replica(r, obj.size_bytes, true);  // a reader may still be copying from it
  if (obj.complete &&
      std::none_of(obj.replicas.begin(), obj.replicas.end(), [](const Replica& x) { return x.complete; })) {
    discard_object(it, true, false);
    return true;
  }
  return false;
}

std::vector<proto::KvEvent> MasterCore::take_events() {
  std::vector<proto::KvEvent> out;
  out.swap(events_);
  return out;
}

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
        it = objects_.erase(it);
        ++lost;
        continue;
      }
      if (!obj.complete && reps.empty()) {
        it = objects_.erase(it);
        continue;
      }
    }
    ++it;
  }
  pending_frees_.erase(std::remove_if(pending_frees_.begin(), pending_frees_.end(),
                                      [&](const PendingFree& p) { return p.segment == segment; }),
                       pending_frees_.end());
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
      objects_.emplace(o.key, std::move(obj));
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

// ---------------------------------------------------------------------------------------------
// Drain
// ---------------------------------------------------------------------------------------------

bool MasterCore::only_on_node(const Object& obj, const std::string& node_id) const {
  if (!obj.complete) return false;
  bool any = false;
  for (const Replica& r : obj.replicas) {
    if (!r.complete) continue;
    auto seg = segments_.find(r.segment);
    if (seg == segments_.end() || seg->second.info.node_id != node_id) return false;
    any = true;
  }
  return any;
}

Result<DrainPage> MasterCore::drain_node(const std::string& node_id, size_t max_tasks, bool final) {
  auto node_it = nodes_.find(node_id);
  if (node_it == nodes_.end()) {
    return Status(
        Code::kNotFound,
        "drain: node '" + node_id + "' is not known to the master (declared dead or never mounted): nothing to move");
  }
  Node& n = node_it->second;
  if (!n.draining) {
    n.draining = true;
    for (const std::string& name : n.segments) {
      auto s = segments_.find(name);
      if (s != segments_.end()) s->second.draining = true;
    }
    MC_LOG_INFO << "storage node " << node_id << " drains: its segments take no new replicas; objects only there "
                << "are copied to other nodes";
  }
  // Copies that vanished meanwhile (abandoned after put_takeover_ms, their target node gone) are not retried.
  for (auto c = n.drain_inflight.begin(); c != n.drain_inflight.end();) {
    auto it = objects_.find(c->second.key);
    const bool alive = it != objects_.end() &&
                       std::any_of(it->second.replicas.begin(), it->second.replicas.end(), [&](const Replica& r) {
                         return r.put_id == c->first && !r.complete && r.drain_node == node_id;
                       });
    if (alive) {
      ++c;
    } else {
      n.drain_skip.insert(c->second.key);
      c = n.drain_inflight.erase(c);
    }
  }
  DrainPage page;
  const auto pending = [&](const std::string& key, const Object& obj) {
    if (n.drain_skip.count(key) || !only_on_node(obj, node_id)) return false;
    return std::none_of(obj.replicas.begin(), obj.replicas.end(),
                        [&](const Replica& r) { return !r.complete && r.drain_node == node_id; });
  };
  if (final) {
    for (const auto& [key, obj] : objects_) page.remaining_objects += only_on_node(obj, node_id) ? 1 : 0;
    page.moved_objects = n.drain_moved;
    page.dropped_objects = n.drain_dropped;
    return page;
  }
  // The queue is refilled only when everything handed out was reported: objects completed on the node
  // meanwhile (puts started before the drain) are found by that next look.
  if (n.drain_queue.empty() && n.drain_inflight.empty()) {
    for (const auto& [key, obj] : objects_) {
      if (pending(key, obj)) n.drain_queue.push_back(key);
    }
  }
  const int64_t now = clock_->now_ns();
  uint64_t no_room = 0;
  std::string no_room_key;
  while (!n.drain_queue.empty() && page.tasks.size() < max_tasks) {
    const std::string key = std::move(n.drain_queue.front());
    n.drain_queue.pop_front();
    auto it = objects_.find(key);
    if (it == objects_.end() || !pending(key, it->second)) continue;
    Object& obj = it->second;
    // The source: the node's DRAM replica (its memory), else its SSD one (its file).
    const Replica* src = nullptr;
    for (const Replica& r : obj.replicas) {
      if (!r.complete) continue;
      if (src == nullptr || segments_.at(r.segment).info.medium == Medium::kCpu) src = &r;
      if (segments_.at(src->segment).info.medium == Medium::kCpu) break;
    }
    const std::string src_segment = src->segment;
    const uint64_t src_offset = src->offset;
    Replica* copy = add_copy(key, obj, "", "", false, now);
    if (copy == nullptr) {
      make_room(obj.size_bytes);  // as put_start: evict in the fullest DRAM segments, then try again
      copy = add_copy(key, obj, "", "", false, now);
    }
    if (copy == nullptr) {
      if (no_room++ == 0) no_room_key = key + "' (" + std::to_string(obj.size_bytes) + " bytes";
      ++n.drain_dropped;
      ++counters_.drain_dropped_objects;
      discard_object(it, true, false);
      continue;
    }
    copy->drain_node = node_id;
    DrainTask t;
    t.key = key;
    t.src_segment = src_segment;
    t.src_offset = src_offset;
    t.size_bytes = obj.size_bytes;
    t.checksum = obj.checksum;
    t.target = view(*copy, obj.size_bytes);
    t.put_id = copy->put_id;
    n.drain_inflight[t.put_id] = {key, src_segment, src_offset};
    page.tasks.push_back(std::move(t));
  }
  if (no_room > 0) {  // one line per page, not one per object (the last node of a pool drops everything)
    MC_LOG_WARN << "drain of node " << node_id << ": " << no_room << " objects fit on no other node and were dropped"
                << " (the first: '" << no_room_key << "); add nodes or room before scaling down";
  }
  page.more = !n.drain_queue.empty() || !n.drain_inflight.empty();
  page.moved_objects = n.drain_moved;
  page.dropped_objects = n.drain_dropped;
  return page;
}

Status MasterCore::drain_done(const std::string& node_id, const std::string& key, uint64_t put_id, bool ok, Code code,
                              const std::string& message) {
  MC_RETURN_IF_ERROR(validate_key(key).with_context("drain_done of node '" + node_id + "'"));
  auto node_it = nodes_.find(node_id);
  const auto not_found = [&] {
    return Status(Code::kNotFound, "drain copy " + std::to_string(put_id) + " of '" + key + "' by node '" + node_id +
                                       "' is not in flight (abandoned, or its target node is gone)");
  };
  if (node_it == nodes_.end()) return not_found();
  Node& n = node_it->second;
  auto c = n.drain_inflight.find(put_id);
  if (c == n.drain_inflight.end() || c->second.key != key) return not_found();
  const Node::DrainCopy copy = c->second;
  n.drain_inflight.erase(c);
  auto it = objects_.find(key);
  if (it == objects_.end()) return not_found();
  Object& obj = it->second;
  auto r = std::find_if(obj.replicas.begin(), obj.replicas.end(),
                        [&](const Replica& x) { return x.put_id == put_id && !x.complete && x.drain_node == node_id; });
  if (r == obj.replicas.end()) return not_found();
  finish_copy(key, obj, r, ok);
  if (ok) {
    ++n.drain_moved;
    ++counters_.drain_moved_objects;
    counters_.drain_moved_bytes += obj.size_bytes;
    return Status::ok();
  }
  n.drain_skip.insert(key);
  if (code == Code::kDataLoss) {
    for (size_t i = 0; i < obj.replicas.size(); ++i) {
      const Replica& x = obj.replicas[i];
      if (x.segment != copy.src_segment || x.offset != copy.src_offset || !x.complete) continue;
      MC_LOG_WARN << "replica of '" << key << "' on " << x.segment << " failed its checksum before its drain copy: "
                  << "dropped";
      ++counters_.corrupt_replicas;
      if (drop_replica(it, i)) {
        ++n.drain_dropped;
        ++counters_.drain_dropped_objects;
      }
      break;
    }
  } else {
    MC_LOG_WARN << "drain copy of '" << key << "' from node " << node_id << " failed (" << message
                << "): abandoned; the object leaves with the node unless it has another replica";
  }
  return Status::ok();
}

void MasterCore::client_heartbeat(const std::string& client_id) { touch_client(client_id); }

// ---------------------------------------------------------------------------------------------
// Space
// ---------------------------------------------------------------------------------------------

int64_t MasterCore::grant_hold_until(int64_t now_ns, int64_t lifetime_ms) const {
  return config_.grant_hold_ms > 0 ? now_ns + (lifetime_ms + config_.grant_hold_ms) * kNsPerMs : 0;
}

void MasterCore::release_replica(const Replica& r, uint64_t size_bytes, bool delayed) {
  auto seg = segments_.find(r.segment);
  if (seg == segments_.end()) return;
  if (seg->second.replicas > 0) --seg->second.replicas;
  if (r.complete) journal(r.segment, r.offset, false);
  const int64_t now = clock_->now_ns();
  int64_t free_at = delayed && config_.free_delay_ms > 0 ? now + config_.free_delay_ms * kNsPerMs : 0;
  free_at = std::max(free_at, r.grant_until_ns);  // a grant handed out for this range still lives
  if (free_at > now) {
    pending_frees_.push_back({r.segment, r.offset, size_bytes, free_at});
    return;
  }
  (void)seg->second.alloc->free(r.offset);
}

void MasterCore::discard_object(ObjectMap::iterator it, bool delayed, bool count_reclaim) {
  dirty(it->first);
  Object& obj = it->second;
  for (const Replica& r : obj.replicas) {
    if (r.complete && obj.complete) emit(proto::kKvEventRemoved, it->first, r.segment);
    if (r.demote_task) demotions_.erase(r.demote_task);
    release_replica(r, obj.size_bytes, delayed || !r.complete);
  }
  if (count_reclaim) ++counters_.reclaimed_puts;
  objects_.erase(it);
}

int MasterCore::rank_for(const Caller& caller, const Segment& seg) const {
  int r = 0;
  if (!caller.host.empty() && seg.info.host == caller.host) {
    r = 0;
  } else if (!caller.domain.empty() && seg.info.domain == caller.domain) {
    r = 1;
  } else {
    r = 2;
  }
  return r * 2 + (seg.info.medium == Medium::kDisk ? 1 : 0);
}

std::vector<std::string> MasterCore::place(uint64_t size_bytes, uint32_t count, const std::string& preferred,
                                           const std::vector<std::string>& exclude_nodes, const std::string& near_host,
                                           bool host_first) {
  std::vector<std::string> chosen;
  std::set<std::string> used_nodes(exclude_nodes.begin(), exclude_nodes.end());
  std::set<std::string> used_domains;
  for (const std::string& n : exclude_nodes) {
    for (const auto& [name, seg] : segments_) {
      if (seg.info.node_id == n) used_domains.insert(seg.info.domain);
    }
  }
  auto fits = [&](const Segment& s) {
    return s.info.medium == Medium::kCpu && !s.offline && !s.draining && !s.unconfirmed &&
           s.alloc->largest_free_bytes() >= s.alloc->rounded(size_bytes);
  };
  auto take = [&](const std::string& name) {
    const Segment& s = segments_.at(name);
    chosen.push_back(name);
    used_nodes.insert(s.info.node_id);
    used_domains.insert(s.info.domain);
  };
  if (!preferred.empty()) {
    auto p = segments_.find(preferred);
    if (p != segments_.end() && fits(p->second) && !used_nodes.count(p->second.info.node_id)) take(preferred);
  }
  while (chosen.size() < count) {
    const std::string* best = nullptr;
    std::tuple<int, int, double> best_score{};
    for (const auto& [name, seg] : segments_) {
      if (used_nodes.count(seg.info.node_id) || !fits(seg)) continue;
      // New failure domain first, then near the caller (hot copies), then the emptiest segment; host_first
      // swaps the first two (a copy that is only useful on near_host).
      int domain_rank = used_domains.count(seg.info.domain) ? 1 : 0;
      int host_rank = (!near_host.empty() && seg.info.host == near_host) ? 0 : 1;
      double usage =
          static_cast<double>(seg.alloc->used_bytes() + size_bytes) / static_cast<double>(seg.alloc->capacity_bytes());
      std::tuple<int, int, double> score =
          host_first ? std::make_tuple(host_rank, domain_rank, usage) : std::make_tuple(domain_rank, host_rank, usage);
      if (!best || score < best_score) {
        best = &name;
        best_score = score;
      }
    }
    if (!best) break;
    take(*best);
  }
  return chosen;
}

std::string MasterCore::find_disk_segment(const std::string& node_id, uint64_t size_bytes) {
  auto node = nodes_.find(node_id);
  if (node == nodes_.end()) return "";
  for (const std::string& name : node->second.segments) {
    const Segment& s = segments_.at(name);
    if (s.info.medium == Medium::kDisk && !s.read_only && !s.offline && !s.draining && !s.unconfirmed &&
        s.alloc->largest_free_bytes() >= s.alloc->rounded(size_bytes)) {
      return name;
    }
  }
  return "";
}

uint64_t MasterCore::evict(const std::string& segment, uint64_t target_used_bytes, uint64_t need_contiguous_bytes) {
  auto seg_it = segments_.find(segment);
  // A suspect node's replicas are kept; a draining node's are moved, not evicted.
  if (seg_it == segments_.end() || seg_it->second.offline || seg_it->second.draining) return 0;
  Segment& seg = seg_it->second;
  // Bytes already on their way out (demotions in flight) count as gone.
  uint64_t leaving = 0;
  for (const auto& [task, who] : demotions_) {
    auto o = objects_.find(who.second);
    if (o == objects_.end()) continue;
    for (const Replica& r : o->second.replicas) {
      if (r.segment == segment && r.complete) leaving += seg.alloc->rounded(o->second.size_bytes);
    }
  }
  // Done when usage is at the target and, for a pending put, a range of its size is free (or is about
  // to be: demotions in flight free their ranges when the node reports).
  auto done = [&] {
    return seg.alloc->used_bytes() <= target_used_bytes + leaving &&
           (need_contiguous_bytes == 0 || leaving > 0 || seg.alloc->largest_free_bytes() >= need_contiguous_bytes);
  };
  if (done()) return 0;
  // Approximate LRU: candidates ordered by the last access the master saw (get_replicas, put_end), oldest
  // first (ties by key). A heap, popped only as far as needed: a pass that frees the 10 % between the
  // watermarks pays O(n) to build it plus O(log n) per victim, not a full sort. Entries point into
  // objects_; only the entry being processed is erased below, which leaves the others valid.
  using Candidate = std::pair<int64_t, ObjectMap::iterator>;
  std::vector<Candidate> candidates;
  for (auto it = objects_.begin(); it != objects_.end(); ++it) {
    Object& obj = it->second;
    if (!obj.complete || leased(obj) || pin_holds(it->first, obj)) continue;
    bool here = false, busy = false;
    for (const Replica& r : obj.replicas) {
      if (r.segment == segment && r.complete) here = true;
      if (!r.complete) busy = true;  // a copy or demotion is being written
    }
    if (here && !busy) candidates.emplace_back(obj.last_access_ns, it);
  }
  auto newer = [](const Candidate& a, const Candidate& b) {
    return a.first != b.first ? a.first > b.first : a.second->first > b.second->first;
  };
  std::make_heap(candidates.begin(), candidates.end(), newer);
  uint64_t freed = 0;
  for (auto end = candidates.end(); end != candidates.begin() && !done(); --end) {
    std::pop_heap(candidates.begin(), end, newer);
    const auto obj_it = (end - 1)->second;
    const std::string& key = obj_it->first;
    Object& obj = obj_it->second;
    dirty(key);
    auto r =
        std::find_if(obj.replicas.begin(), obj.replicas.end(), [&](const Replica& x) { return x.segment == segment; });
    uint64_t rounded = seg.alloc->rounded(obj.size_bytes);
    std::string disk = seg.info.medium == Medium::kCpu ? find_disk_segment(seg.info.node_id, obj.size_bytes) : "";
    if (!disk.empty()) {
      Segment& dseg = segments_.at(disk);
      Result<uint64_t> off = dseg.alloc->allocate(obj.size_bytes);
      if (off.is_ok()) {
        DemoteTask task{next_task_id_++, key, segment, r->offset, disk, off.value(), obj.size_bytes, obj.checksum};
        Replica dst;
        dst.segment = disk;
        dst.offset = off.value();
        dst.started_ns = clock_->now_ns();
        dst.demote_task = task.task_id;
        ++dseg.replicas;
        obj.replicas.push_back(dst);
        demotions_[task.task_id] = {seg.info.node_id, key};
        nodes_[seg.info.node_id].tasks.push_back(task);
        leaving += rounded;
        continue;
      }
    }
    ++seg.evictions;
    ++counters_.evictions;
    emit(proto::kKvEventRemoved, key, segment);
    release_replica(*r, obj.size_bytes, false);
    obj.replicas.erase(r);
    freed += rounded;
    if (std::none_of(obj.replicas.begin(), obj.replicas.end(), [](const Replica& x) { return x.complete; })) {
      objects_.erase(obj_it);
    }
  }
  return freed;
}

// ---------------------------------------------------------------------------------------------
// Objects
// ---------------------------------------------------------------------------------------------

ReplicaView MasterCore::view(const Replica& r, uint64_t size_bytes) const {
  ReplicaView v;
  v.segment = segments_.at(r.segment).info;
  v.offset = r.offset;
  v.size_bytes = size_bytes;
  return v;
}

Result<PutGrant> MasterCore::put_start(const Caller& caller, const std::string& key, uint64_t size_bytes,
                                       const PutOptions& options) {
  MC_RETURN_IF_ERROR(validate_key(key));
  if (size_bytes == 0)
    return Status(Code::kInvalidArgument, "put '" + key + "': size 0 bytes (objects hold at least one byte)");
  if (size_bytes > config_.max_object_bytes) {
    return Status(Code::kInvalidArgument, "put '" + key + "': size " + std::to_string(size_bytes) +
                                              " bytes exceeds the limit of " +
                                              std::to_string(config_.max_object_bytes) + " bytes");
  }
  if (caller.client_id.empty()) return Status(Code::kInvalidArgument, "put '" + key + "': client id missing");
  if (options.pin_ttl_ms < 0 || options.pin_ttl_ms > kMaxPinTtlMs) {
    return Status(Code::kInvalidArgument, "put '" + key + "': pin TTL of " + std::to_string(options.pin_ttl_ms) +
                                              " ms is outside 0.." + std::to_string(kMaxPinTtlMs) +
                                              " (0: pinned until unpin)");
  }
  uint32_t want = std::clamp<uint32_t>(options.replicas, 1, config_.max_replicas);
  touch_client(caller.client_id);
  int64_t now = clock_->now_ns();
  auto it = objects_.find(key);
  if (it != objects_.end()) {
    Object& obj = it->second;
    if (obj.complete) {
      if (!options.overwrite) return Status(Code::kAlreadyExists, "object '" + key + "' already exists");
      if (leased(obj))
        return Status(Code::kObjectBusy, "object '" + key + "' is leased by a reader; retry after its lease");
      discard_object(it, false, false);
    } else {
      auto writer = clients_.find(obj.writer);
      bool writer_dead = writer == clients_.end() || now - writer->second > config_.client_ttl_ms * kNsPerMs;
      bool stale = now - obj.started_ns >= config_.put_takeover_ms * kNsPerMs;
      if (!stale && !writer_dead) {
        return Status(Code::kObjectBusy, "object '" + key + "' is being written by client '" + obj.writer +
                                             "'; retry later (taken over after " +
                                             std::to_string(config_.put_takeover_ms) + " ms)");
      }
      MC_LOG_INFO << "put '" << key << "': taking over from stale writer " << obj.writer;
      discard_object(it, true, true);
    }
  }
  // The first replica goes to the writer's host when a segment there has room (a prefill instance stores the
  // blocks it computed next to itself, where the Conductor will look for them), the others to new failure domains.
  std::vector<std::string> segs = place(size_bytes, want, options.preferred_segment, {}, caller.host);
  if (segs.empty()) {
    // Just after a takeover the nodes have not all confirmed to this master yet (their next heartbeat, which they
    // send at once when they see the new leader): a transient refusal, not a full pool.
    const size_t unconfirmed = static_cast<size_t>(std::count_if(segments_.begin(), segments_.end(), [](const auto& s) {
      return s.second.unconfirmed && s.second.info.medium == Medium::kCpu;
    }));
    if (unconfirmed > 0) {
      return Status(Code::kUnavailable, "put '" + key + "': this master took over just now and " +
                                            std::to_string(unconfirmed) +
                                            " DRAM segment(s) have not been confirmed by their nodes' heartbeats yet; "
                                            "retry shortly");
    }
  }
  if (segs.empty()) {
    // Make room in the fullest DRAM segments, then try again.
    make_room(size_bytes);
    segs = place(size_bytes, want, options.preferred_segment, {}, caller.host);
  }
  if (segs.empty()) {
    for (const auto& [name, seg] : segments_) {
      MC_LOG_DEBUG << "put '" << key << "' found no room: segment " << name << " used " << seg.alloc->used_bytes()
                   << " of " << seg.alloc->capacity_bytes() << " bytes, largest free range "
                   << seg.alloc->largest_free_bytes() << ", demotions in flight " << demotions_.size();
    }
  }
  if (segs.empty() && !demotions_.empty()) {
    return Status(Code::kUnavailable, "put '" + key + "': DRAM is full while " + std::to_string(demotions_.size()) +
                                          " objects are being demoted to SSD; retry shortly");
  }
  if (segs.empty()) {
    return Status(
        Code::kNoSpace,
        "put '" + key + "': no DRAM segment has " + std::to_string(size_bytes) +
            " free bytes (every object is leased, pinned or being demoted, or no node is mounted); retry or add nodes");
  }
  Object obj;
  obj.size_bytes = size_bytes;
  obj.put_id = next_put_id_++;
  obj.writer = caller.client_id;
  obj.started_ns = now;
  obj.last_access_ns = now;
  obj.pinned = options.pin;
  obj.pin_until_ns = options.pin && options.pin_ttl_ms > 0 ? now + options.pin_ttl_ms * kNsPerMs : 0;
  if (options.pin) pinned_keys_.insert(key);
  PutGrant grant;
  grant.put_id = obj.put_id;
  for (const std::string& s : segs) {
    Segment& seg = segments_.at(s);
    Result<uint64_t> off = seg.alloc->allocate(size_bytes);
    if (!off.is_ok()) continue;  // cannot happen: place() checked the largest free range
    ++seg.replicas;
    Replica r;
    r.segment = s;
    r.offset = off.value();
    r.put_id = obj.put_id;
    r.writer = caller.client_id;
    r.started_ns = now;
    r.grant_until_ns = grant_hold_until(now, config_.put_takeover_ms);
    obj.replicas.push_back(r);
    grant.replicas.push_back(view(r, size_bytes));
  }
  objects_[key] = std::move(obj);
  dirty(key);
  unfinished_.insert(key);
  // Keep headroom: segments past the high watermark are evicted down to the low one.
  for (const std::string& s : segs) {
    Segment& seg = segments_.at(s);
    double cap = static_cast<double>(seg.alloc->capacity_bytes());
    if (static_cast<double>(seg.alloc->used_bytes()) > config_.high_watermark * cap) {
      evict(s, static_cast<uint64_t>(config_.low_watermark * cap));
    }
  }
  return grant;
}

void MasterCore::make_room(uint64_t size_bytes) {
  for (auto& [name, seg] : segments_) {
    if (seg.info.medium != Medium::kCpu || seg.draining) continue;
    uint64_t need = seg.alloc->rounded(size_bytes);
    uint64_t target = seg.alloc->capacity_bytes() > need ? seg.alloc->capacity_bytes() - need : 0;
    target = std::min<uint64_t>(target, static_cast<uint64_t>(config_.low_watermark * seg.alloc->capacity_bytes()));
    evict(name, target, need);
  }
}

Status MasterCore::put_end(const Caller& caller, const std::string& key, uint64_t put_id, uint64_t checksum,
                           uint64_t part_bytes, std::vector<uint64_t> part_checksums) {
  MC_RETURN_IF_ERROR(validate_key(key));
  touch_client(caller.client_id);
  auto it = objects_.find(key);
  if (it == objects_.end() || it->second.put_id != put_id || it->second.complete) {
    ++counters_.refused_put_ends;
    return Status(Code::kFailedPrecondition,
                  "put_end '" + key + "' (put " + std::to_string(put_id) +
                      "): no such put in progress (revoked, reclaimed or taken over by another writer)");
  }
  Object& obj = it->second;
  if ((part_bytes != 0 || !part_checksums.empty()) && !parts_fit(obj.size_bytes, part_bytes, part_checksums.size())) {
    ++counters_.refused_put_ends;
    return Status(Code::kInvalidArgument, "put_end '" + key + "': " + std::to_string(part_checksums.size()) +
                                              " part checksums of " + std::to_string(part_bytes) +
                                              " bytes do not cut an object of " + std::to_string(obj.size_bytes) +
                                              " bytes (at most " + std::to_string(kMaxObjectParts) + " parts)");
  }
  dirty(key);
  obj.complete = true;
  obj.checksum = checksum;
  obj.part_bytes = part_checksums.empty() ? 0 : part_bytes;
  obj.part_checksums = std::move(part_checksums);
  obj.last_access_ns = clock_->now_ns();
  for (Replica& r : obj.replicas) {
    r.complete = true;
    journal(r.segment, r.offset, true, key, &obj);
    emit(proto::kKvEventStored, key, r.segment);
  }
  ++counters_.puts;
  return Status::ok();
}

Status MasterCore::put_revoke(const Caller& caller, const std::string& key, uint64_t put_id) {
  MC_RETURN_IF_ERROR(validate_key(key));
  touch_client(caller.client_id);
  auto it = objects_.find(key);
  if (it == objects_.end() || it->second.put_id != put_id || it->second.complete) {
    return Status(Code::kFailedPrecondition,
                  "put_revoke '" + key + "' (put " + std::to_string(put_id) + "): no such put in progress");
  }
  discard_object(it, true, false);
  return Status::ok();
}

Result<ReadGrant> MasterCore::get_replicas(const Caller& caller, const std::string& key, bool with_parts) {
  MC_RETURN_IF_ERROR(validate_key(key));
  touch_client(caller.client_id);
  auto it = objects_.find(key);
  if (it == objects_.end() || !it->second.complete) {
    ++counters_.misses;
    return Status(Code::kObjectNotFound, "object '" + key + "' not found");
  }
  Object& obj = it->second;
  int64_t now = clock_->now_ns();
  std::vector<std::pair<int, const Replica*>> ranked;
  for (const Replica& r : obj.replicas) {
    if (!offered(r)) continue;
    ranked.emplace_back(rank_for(caller, segments_.at(r.segment)), &r);
  }
  if (ranked.empty()) {
    ++counters_.misses;
    return Status(Code::kObjectNotFound,
                  "object '" + key + "' has no replica offered now (its nodes are suspect or re-reporting)");
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  ReadGrant grant;
  grant.size_bytes = obj.size_bytes;
  grant.checksum = obj.checksum;
  if (with_parts) {
    grant.part_bytes = obj.part_bytes;
    grant.part_checksums = obj.part_checksums;
  }
  for (const auto& [rank, r] : ranked) grant.replicas.push_back(view(*r, obj.size_bytes));
  const int64_t read_hold = grant_hold_until(now, config_.lease_ms);
  for (Replica& r : obj.replicas) {
    if (offered(r)) r.grant_until_ns = std::max(r.grant_until_ns, read_hold);
  }
  grant.lease_ms = config_.lease_ms;
  obj.lease_until_ns = std::max(obj.lease_until_ns, now + config_.lease_ms * kNsPerMs);
  obj.last_access_ns = now;
  ++segments_.at(ranked.front().second->segment).hits;
  ++counters_.hits;

  bool copying = std::any_of(obj.replicas.begin(), obj.replicas.end(), [](const Replica& r) { return !r.complete; });
  const bool wanted_here = !obj.wanted_host.empty() && obj.wanted_host == caller.host && now <= obj.wanted_until_ns;
  if (wanted_here && !copying && !caller.client_id.empty() && !has_replica_on_host(obj, caller.host)) {
    if (grant_copy(key, obj, caller, true, now, grant)) {
      obj.wanted_host.clear();
      ++counters_.hot_replications;
      copying = true;
    }
  }
  if (config_.hot_read_threshold > 0) {
    if (now - obj.window_start_ns > config_.hot_window_ms * kNsPerMs) {
      obj.window_start_ns = now;
      obj.window_reads = 0;
    }
    ++obj.window_reads;
    if (obj.window_reads > config_.hot_read_threshold && !copying && !caller.client_id.empty() &&
        grant_copy(key, obj, caller, false, now, grant)) {
      obj.window_reads = 0;
      ++counters_.hot_replications;
    }
  }
  return grant;
}

bool MasterCore::has_replica_on_host(const Object& obj, const std::string& host) const {
  return std::any_of(obj.replicas.begin(), obj.replicas.end(),
                     [&](const Replica& r) { return segments_.at(r.segment).info.host == host; });
}

bool MasterCore::grant_copy(const std::string& key, Object& obj, const Caller& caller, bool require_near_host,
                            int64_t now_ns, ReadGrant& grant) {
  if (obj.replicas.size() >= config_.max_replicas) return false;
  Replica* r = add_copy(key, obj, caller.client_id, caller.host, require_near_host, now_ns);
  if (r == nullptr) return false;
  grant.replicate_to = view(*r, obj.size_bytes);
  grant.replicate_put_id = r->put_id;
  return true;
}

MasterCore::Replica* MasterCore::add_copy(const std::string& key, Object& obj, const std::string& writer,
                                          const std::string& near_host, bool require_near_host, int64_t now_ns) {
  std::vector<std::string> holders;
  for (const Replica& r : obj.replicas) holders.push_back(segments_.at(r.segment).info.node_id);
  std::vector<std::string> segs = place(obj.size_bytes, 1, "", holders, near_host, require_near_host);
  if (segs.empty()) return nullptr;
  Segment& seg = segments_.at(segs.front());
  if (require_near_host && seg.info.host != near_host) return nullptr;
  Result<uint64_t> off = seg.alloc->allocate(obj.size_bytes);
  if (!off.is_ok()) return nullptr;  // cannot happen: place() checked the largest free range
  ++seg.replicas;
  Replica r;
  r.segment = segs.front();
  r.offset = off.value();
  r.put_id = next_put_id_++;
  r.writer = writer;
  r.started_ns = now_ns;
  r.grant_until_ns = grant_hold_until(now_ns, config_.put_takeover_ms);
  obj.replicas.push_back(r);
  dirty(key);
  unfinished_.insert(key);  // tick() reclaims the copy if its writer never finishes it
  return &obj.replicas.back();
}

void MasterCore::finish_copy(const std::string& key, Object& obj, std::vector<Replica>::iterator r, bool ok) {
  dirty(key);
  if (ok) {
    r->complete = true;
    r->drain_node.clear();
    journal(r->segment, r->offset, true, key, &obj);
    emit(proto::kKvEventStored, key, r->segment);
  } else {
    release_replica(*r, obj.size_bytes, true);  // the copier may still be writing: freed free_delay_ms later
    obj.replicas.erase(r);
  }
}

Result<uint32_t> MasterCore::replicate_near(const std::vector<std::string>& keys, const std::string& host) {
  if (host.empty()) return Status(Code::kInvalidArgument, "replicate_near: empty host (name the host to copy to)");
  const int64_t now = clock_->now_ns();
  uint32_t marked = 0;
  for (const std::string& key : keys) {
    MC_RETURN_IF_ERROR(validate_key(key));
    auto it = objects_.find(key);
    if (it == objects_.end() || !it->second.complete) continue;
    Object& obj = it->second;
    if (obj.replicas.size() >= config_.max_replicas || has_replica_on_host(obj, host)) continue;
    obj.wanted_host = host;
    obj.wanted_until_ns = now + config_.hot_window_ms * kNsPerMs;
    ++marked;
  }
  return marked;
}

Status MasterCore::replica_end(const Caller& caller, const std::string& key, uint64_t put_id, bool ok) {
  MC_RETURN_IF_ERROR(validate_key(key));
  touch_client(caller.client_id);
  auto it = objects_.find(key);
  if (it != objects_.end()) {
    Object& obj = it->second;
    for (auto r = obj.replicas.begin(); r != obj.replicas.end(); ++r) {
      if (r->put_id != put_id || r->complete || r->demote_task || !r->drain_node.empty() || !obj.complete) continue;
      finish_copy(key, obj, r, ok);
      return Status::ok();
    }
  }
  ++counters_.refused_put_ends;
  return Status(Code::kFailedPrecondition,
                "replica_end '" + key + "' (copy " + std::to_string(put_id) + "): no such copy in progress");
}

bool MasterCore::exists(const std::string& key) const {
  auto it = objects_.find(key);
  return it != objects_.end() && it->second.complete && any_offered(it->second);
}

uint64_t MasterCore::match_prefix(const std::vector<std::string>& keys) const {
  uint64_t n = 0;
  for (const std::string& k : keys) {
    if (!exists(k)) break;
    ++n;
  }
  return n;
}

Status MasterCore::remove(const std::string& key) {
  MC_RETURN_IF_ERROR(validate_key(key));
  auto it = objects_.find(key);
  if (it == objects_.end()) return Status(Code::kObjectNotFound, "object '" + key + "' not found");
  if (!it->second.complete) {
    return Status(Code::kObjectBusy,
                  "object '" + key + "' is being written by client '" + it->second.writer + "'; retry later");
  }
  if (leased(it->second))
    return Status(Code::kObjectBusy, "object '" + key + "' is leased by a reader; retry after its lease");
  discard_object(it, false, false);
  ++counters_.removes;
  return Status::ok();
}

Status MasterCore::pin(const std::string& key, int64_t ttl_ms) {
  MC_RETURN_IF_ERROR(validate_key(key));
  if (ttl_ms < 0 || ttl_ms > kMaxPinTtlMs) {
    return Status(Code::kInvalidArgument, "pin '" + key + "': TTL of " + std::to_string(ttl_ms) + " ms is outside 0.." +
                                              std::to_string(kMaxPinTtlMs) + " (0: pinned until unpin)");
  }
  auto it = objects_.find(key);
  if (it == objects_.end()) {
    return Status(Code::kObjectNotFound, "pin '" + key + "': object not found (put it first)");
  }
  Object& obj = it->second;
  if (!obj.complete) {
    return Status(Code::kObjectBusy,
                  "pin '" + key + "': object is being written by client '" + obj.writer + "'; retry after its put");
  }
  obj.pinned = true;
  obj.pin_until_ns = ttl_ms > 0 ? clock_->now_ns() + ttl_ms * kNsPerMs : 0;
  pinned_keys_.insert(key);
  dirty(key);
  return Status::ok();
}

Status MasterCore::unpin(const std::string& key) {
  MC_RETURN_IF_ERROR(validate_key(key));
  auto it = objects_.find(key);
  if (it == objects_.end()) return Status(Code::kObjectNotFound, "unpin '" + key + "': object not found");
  it->second.pinned = false;
  it->second.pin_until_ns = 0;
  pinned_keys_.erase(key);
  dirty(key);
  return Status::ok();
}

std::vector<ObjectInfo> MasterCore::ls(const std::string& prefix, size_t limit) const {
  std::vector<ObjectInfo> out;
  // The first `limit` matching keys in key order: a scan (the map is hashed), then a partial sort.
  std::vector<ObjectMap::const_iterator> match;
  for (auto it = objects_.begin(); it != objects_.end(); ++it) {
    if (it->first.compare(0, prefix.size(), prefix) == 0) match.push_back(it);
  }
  const size_t n = std::min(limit, match.size());
  std::partial_sort(match.begin(), match.begin() + static_cast<std::ptrdiff_t>(n), match.end(),
                    [](const auto& a, const auto& b) { return a->first < b->first; });
  match.resize(n);
  for (auto it : match) {
    ObjectInfo info;
    info.key = it->first;
    info.size_bytes = it->second.size_bytes;
    info.complete = it->second.complete;
    info.leased = leased(it->second);
    info.pinned = pinned(it->second);
    for (const Replica& r : it->second.replicas) {
      if (!r.complete) continue;
      info.segments.push_back(r.segment);
      info.media.emplace_back(medium_name(segments_.at(r.segment).info.medium));
    }
    out.push_back(std::move(info));
  }
  return out;
}

MasterStats MasterCore::stat(bool scan_objects) const {
  MasterStats s = counters_;
  std::map<std::string, uint64_t> leased_on;
  if (scan_objects) {
    for (const auto& [key, obj] : objects_) {
      if (obj.complete)
        ++s.objects;
      else
        ++s.processing;
      if (leased(obj)) {
        for (const Replica& r : obj.replicas) ++leased_on[r.segment];
      }
    }
  } else {
    for (const std::string& k : unfinished_) {
      auto it = objects_.find(k);
      if (it != objects_.end() && !it->second.complete) ++s.processing;
    }
    s.objects = objects_.size() - s.processing;
  }
  for (const auto& [name, seg] : segments_) {
    SegmentStats st;
    st.info = seg.info;
    st.used_bytes = seg.alloc->used_bytes();
    st.objects = seg.replicas;
    st.leased_objects = leased_on[name];
    st.hits = seg.hits;
    st.evictions = seg.evictions;
    st.demotions = seg.demotions;
    st.largest_free_bytes = seg.alloc->largest_free_bytes();
    st.fragmentation = seg.alloc->fragmentation();
    st.suspect = seg.offline;
    st.unconfirmed = seg.unconfirmed;
    st.read_only = seg.read_only;
    st.draining = seg.draining;
    s.segments.push_back(std::move(st));
  }
  for (const PendingFree& p : pending_frees_) s.pending_free_bytes += p.size_bytes;
  for (const std::string& k : pinned_keys_) {
    auto it = objects_.find(k);
    if (it == objects_.end() || !it->second.complete || !pinned(it->second)) continue;
    ++s.pinned_objects;
    s.pinned_bytes += it->second.size_bytes;
  }
  s.nodes = nodes_.size();
  for (const auto& [id, node] : nodes_) s.suspect_nodes += node.suspect || node.reporting ? 1 : 0;
  s.clients = clients_.size();
  return s;
}

void MasterCore::tick() {
  int64_t now = clock_->now_ns();
  // Nodes that missed their heartbeats are suspect (replicas kept, not offered); after the grace period
  // they are dead: all their replicas leave at once.
  std::vector<std::string> dead;
  for (auto& [id, node] : nodes_) {
    const int64_t silent_ns = now - node.last_heartbeat_ns;
    if (silent_ns <= config_.node_ttl_ms * kNsPerMs) continue;
    if (config_.node_grace_ms <= 0 || silent_ns > (config_.node_ttl_ms + config_.node_grace_ms) * kNsPerMs) {
      dead.push_back(id);
    } else if (!node.suspect) {
      MC_LOG_WARN << "storage node " << id << " missed its heartbeats for " << config_.node_ttl_ms
                  << " ms: suspect, its replicas are kept but not offered for " << config_.node_grace_ms << " ms";
      node.suspect = true;
      node.reporting = false;
      set_offline(node, true);
    }
  }
  for (const std::string& id : dead) {
    MC_LOG_INFO << "storage node " << id << " missed its heartbeats for "
                << config_.node_ttl_ms + std::max<int64_t>(config_.node_grace_ms, 0)
                << " ms: dead, dropping its segments and replicas";
    drop_node(id);
  }
  // Dead clients: forget them; their unfinished puts are reclaimed below.
  std::set<std::string> dead_clients;
  for (auto c = clients_.begin(); c != clients_.end();) {
    if (now - c->second > config_.client_ttl_ms * kNsPerMs) {
      dead_clients.insert(c->first);
      c = clients_.erase(c);
    } else {
      ++c;
    }
  }
  // Unfinished puts and hot copies (only keys in unfinished_ can have them; finished ones leave the set).
  for (auto k = unfinished_.begin(); k != unfinished_.end();) {
    auto it = objects_.find(*k);
    if (it == objects_.end()) {
      k = unfinished_.erase(k);
      continue;
    }
    Object& obj = it->second;
    bool pending = false;
    if (!obj.complete) {
      if (dead_clients.count(obj.writer) || now - obj.started_ns > config_.put_reclaim_ms * kNsPerMs) {
        discard_object(it, true, true);
        k = unfinished_.erase(k);
        continue;
      }
      pending = true;
    } else {
      // Abandoned hot-object copies.
      for (auto r = obj.replicas.begin(); r != obj.replicas.end();) {
        const bool copy = !r->complete && !r->demote_task;
        bool abandoned =
            copy && (dead_clients.count(r->writer) || now - r->started_ns > config_.put_takeover_ms * kNsPerMs);
        if (abandoned) {
          dirty(*k);
          release_replica(*r, obj.size_bytes, true);
          r = obj.replicas.erase(r);
        } else {
          pending = pending || copy;
          ++r;
        }
      }
    }
    k = pending ? std::next(k) : unfinished_.erase(k);
  }
  // Soft pins that ran out (pinned() already ignores them; here they are counted and forgotten), and keys
  // whose object is gone or unpinned.
  for (auto k = pinned_keys_.begin(); k != pinned_keys_.end();) {
    auto it = objects_.find(*k);
    if (it == objects_.end() || !it->second.pinned) {
      k = pinned_keys_.erase(k);
      continue;
    }
    k = pin_holds(*k, it->second) ? std::next(k) : pinned_keys_.erase(k);
  }
  // Delayed frees whose time has come.
  for (auto p = pending_frees_.begin(); p != pending_frees_.end();) {
    if (p->release_ns <= now) {
      auto seg = segments_.find(p->segment);
      if (seg != segments_.end()) (void)seg->second.alloc->free(p->offset);
      p = pending_frees_.erase(p);
    } else {
      ++p;
    }
  }
  // Watermarks.
  for (auto& [name, seg] : segments_) {
    double cap = static_cast<double>(seg.alloc->capacity_bytes());
    if (static_cast<double>(seg.alloc->used_bytes()) > config_.high_watermark * cap) {
      evict(name, static_cast<uint64_t>(config_.low_watermark * cap));
    }
  }
}

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
        pending_frees_.push_back({r.segment, r.offset, d.size_bytes, hold_until});
        ++out.held_ranges;
      }
    }
    if (obj.replicas.empty()) continue;  // an unfinished put: only its ranges are held
    if (obj.pinned) pinned_keys_.insert(d.key);
    objects_.emplace(d.key, std::move(obj));
    ++out.objects;
  }
  return out;
}

}  // namespace mc::store
