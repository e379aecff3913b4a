// MasterCore (master_core.hpp): a storage node's graceful drain. The class is split across master_*.cpp by its header's
// paragraphs.
#include "mc/store/master_core.hpp"

#include <algorithm>
#include <set>
#include <tuple>

#include "master_core_internal.hpp"
#include "mc/common/log.hpp"

namespace mc::store {

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

}  // namespace mc::store
