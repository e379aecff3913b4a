// MasterCore (master_core.hpp): space: placement, delayed frees, eviction and SSD demotion. The class is split across
// master_*.cpp by its header's paragraphs.
#include "mc/store/master_core.hpp"

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

#include "master_core_internal.hpp"
#include "mc/common/log.hpp"

namespace mc::store {

// ---------------------------------------------------------------------------------------------
// Space
// ---------------------------------------------------------------------------------------------

int64_t MasterCore::grant_hold_until(int64_t now_ns, int64_t lifetime_ms) const {
  return config_.grant_hold_ms > 0 ? now_ns + (lifetime_ms + config_.grant_hold_ms) * kNsPerMs : 0;
}

void MasterCore::defer_free(PendingFree p) {
  pending_free_bytes_ += p.size_bytes;
  pending_frees_.push_back(std::move(p));
  std::push_heap(pending_frees_.begin(), pending_frees_.end(), ReleasesLater{});
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
    defer_free({r.segment, r.offset, size_bytes, free_at});
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
  account(obj, -1);
  index_drop(it);
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

namespace {

// Placement load (place()): a replica placed counts 1, halving every kPlacementHalfLifeMs, so that the counts weigh
// about the last 5 s (field report 20's window). A node may take its fair share (1 / the nodes that fit) plus
// kPlacementShareMargin of the recent placements; the cap applies from kPlacementMinRecent recent placements on, so
// a handful of puts still go to the emptiest segment.
constexpr double kPlacementHalfLifeMs = 2500;
constexpr double kPlacementShareMargin = 0.10;
constexpr double kPlacementMinRecent = 16;

double decayed(double count, int64_t at_ns, int64_t now_ns) {
  if (count == 0 || now_ns <= at_ns) return count;
  return count * std::exp2(-static_cast<double>(now_ns - at_ns) / (kPlacementHalfLifeMs * 1e6));
}

}  // namespace

std::vector<std::string> MasterCore::place(uint64_t size_bytes, uint32_t count, const std::string& preferred,
                                           const std::vector<std::string>& exclude_nodes, const std::string& near_host,
                                           bool host_first) {
  const int64_t now = clock_->now_ns();
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
    auto node = nodes_.find(s.info.node_id);
    if (node != nodes_.end()) {
      node->second.placed_recent = decayed(node->second.placed_recent, node->second.placed_at_ns, now) + 1;
      node->second.placed_at_ns = now;
    }
    placed_recent_ = decayed(placed_recent_, placed_at_ns_, now) + 1;
    placed_at_ns_ = now;
  };
  // The share cap (see place() in master_core.hpp); the nodes that fit are counted only when it may apply.
  const double recent = decayed(placed_recent_, placed_at_ns_, now);
  std::set<std::string> fitting_nodes;
  if (!host_first && recent >= kPlacementMinRecent) {
    for (const auto& [name, seg] : segments_) {
      if (fits(seg)) fitting_nodes.insert(seg.info.node_id);
    }
  }
  const bool capped = fitting_nodes.size() >= 2;
  const double cap = capped ? recent * (1.0 / static_cast<double>(fitting_nodes.size()) + kPlacementShareMargin) : 0.0;
  auto over_share = [&](const std::string& node_id) {
    if (!capped) return false;
    auto node = nodes_.find(node_id);
    return node != nodes_.end() && decayed(node->second.placed_recent, node->second.placed_at_ns, now) > cap;
  };
  if (!preferred.empty()) {
    auto p = segments_.find(preferred);
    if (p != segments_.end() && fits(p->second) && !used_nodes.count(p->second.info.node_id)) take(preferred);
  }
  while (chosen.size() < count) {
    const std::string* best = nullptr;
    std::tuple<int, int, int, double> best_score{};
    for (const auto& [name, seg] : segments_) {
      if (used_nodes.count(seg.info.node_id) || !fits(seg)) continue;
      // New failure domain first, then the writer's own host, then a node within its share of the recent
      // placements, then the emptiest segment; host_first puts near_host first (a copy only useful there).
      const int share_rank = over_share(seg.info.node_id) ? 1 : 0;
      int domain_rank = used_domains.count(seg.info.domain) ? 1 : 0;
      int host_rank = (!near_host.empty() && seg.info.host == near_host) ? 0 : 1;
      double usage =
          static_cast<double>(seg.alloc->used_bytes() + size_bytes) / static_cast<double>(seg.alloc->capacity_bytes());
      std::tuple<int, int, int, double> score = host_first ? std::make_tuple(host_rank, domain_rank, share_rank, usage)
                                                           : std::make_tuple(domain_rank, host_rank, share_rank, usage);
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
      account(obj, -1);
      index_drop(obj_it);
      objects_.erase(obj_it);
    }
  }
  return freed;
}

}  // namespace mc::store
