#include "mc/sched/prefix_index.hpp"

#include <algorithm>

#include "mc/common/log.hpp"
#include "mc/proto/kv_events.hpp"

namespace mc::sched {

uint32_t PrefixIndex::intern_backend(const std::string& name) {
  auto it = backend_ids_.find(name);
  if (it != backend_ids_.end()) return it->second;
  auto idx = static_cast<uint32_t>(backends_.size());
  backends_.push_back(Backend{name, kUnknownHost, UINT32_MAX, {}, false, {}});
  backend_ids_.emplace(name, idx);
  return idx;
}

uint32_t PrefixIndex::intern_stream(const std::string& name) {
  auto it = stream_ids_.find(name);
  if (it != stream_ids_.end()) return it->second;
  auto idx = static_cast<uint32_t>(streams_.size());
  streams_.push_back(Stream{name, 0, false, 0});
  stream_ids_.emplace(name, idx);
  return idx;
}

void PrefixIndex::add_holder(uint64_t seq_hash, Holder h) {
  if (backends_[h.backend].offline) {
    backends_[h.backend].parked[seq_hash] = h.medium;
    return;
  }
  auto& v = blocks_[seq_hash];
  if (std::find(v.begin(), v.end(), h) != v.end()) return;
  v.push_back(h);
  ++holder_entries_;
  backends_[h.backend].hashes.insert(seq_hash);
}

void PrefixIndex::remove_holder(uint64_t seq_hash, Holder h) {
  if (Backend& b = backends_[h.backend]; b.offline) {
    auto p = b.parked.find(seq_hash);
    if (p != b.parked.end() && p->second == h.medium) b.parked.erase(p);
    return;
  }
  auto it = blocks_.find(seq_hash);
  if (it == blocks_.end()) return;
  auto& v = it->second;
  auto pos = std::find(v.begin(), v.end(), h);
  if (pos == v.end()) return;
  v.erase(pos);
  --holder_entries_;
  bool backend_still_holds = std::any_of(v.begin(), v.end(), [&](const Holder& o) { return o.backend == h.backend; });
  if (!backend_still_holds) backends_[h.backend].hashes.erase(seq_hash);
  if (v.empty()) blocks_.erase(it);
}

void PrefixIndex::add(uint64_t seq_hash, const std::string& backend_id, Medium medium) {
  add_holder(seq_hash, Holder{intern_backend(backend_id), medium});
}

void PrefixIndex::remove(uint64_t seq_hash, const std::string& backend_id, Medium medium) {
  auto it = backend_ids_.find(backend_id);
  if (it == backend_ids_.end()) return;
  remove_holder(seq_hash, Holder{it->second, medium});
}

size_t PrefixIndex::remove_backend(const std::string& backend_id) {
  auto it = backend_ids_.find(backend_id);
  if (it == backend_ids_.end()) return 0;
  uint32_t b = it->second;
  if (backends_[b].offline) {
    const size_t parked = backends_[b].parked.size();
    backends_[b].parked.clear();
    return parked;
  }
  size_t removed = 0;
  for (uint64_t h : backends_[b].hashes) {
    auto bit = blocks_.find(h);
    if (bit == blocks_.end()) continue;
    auto& v = bit->second;
    size_t before = v.size();
    v.erase(std::remove_if(v.begin(), v.end(), [&](const Holder& x) { return x.backend == b; }), v.end());
    removed += before - v.size();
    if (v.empty()) blocks_.erase(bit);
  }
  holder_entries_ -= removed;
  backends_[b].hashes.clear();
  return removed;
}

size_t PrefixIndex::set_backend_offline(const std::string& backend_id, bool offline) {
  const uint32_t b = intern_backend(backend_id);
  Backend& backend = backends_[b];
  if (backend.offline == offline) return 0;
  size_t moved = 0;
  if (offline) {
    for (uint64_t h : backend.hashes) {
      auto bit = blocks_.find(h);
      if (bit == blocks_.end()) continue;
      auto& v = bit->second;
      for (const Holder& x : v) {
        if (x.backend == b) {
          backend.parked[h] = x.medium;
          ++moved;
        }
      }
      v.erase(std::remove_if(v.begin(), v.end(), [&](const Holder& x) { return x.backend == b; }), v.end());
      if (v.empty()) blocks_.erase(bit);
    }
    holder_entries_ -= moved;
    backend.hashes.clear();
    backend.offline = true;
    ++counters_.backends_parked;
  } else {
    backend.offline = false;
    std::unordered_map<uint64_t, Medium> parked;
    parked.swap(backend.parked);
    for (const auto& [h, m] : parked) add_holder(h, Holder{b, m});
    moved = parked.size();
    ++counters_.backends_returned;
  }
  return moved;
}

bool PrefixIndex::backend_offline(const std::string& backend_id) const {
  auto it = backend_ids_.find(backend_id);
  return it != backend_ids_.end() && backends_[it->second].offline;
}

size_t PrefixIndex::offline_backends() const {
  return static_cast<size_t>(
      std::count_if(backends_.begin(), backends_.end(), [](const Backend& b) { return b.offline; }));
}

void PrefixIndex::set_backend_host(const std::string& backend_id, uint32_t host_index) {
  backends_[intern_backend(backend_id)].host = host_index;
}

std::vector<std::string> PrefixIndex::backends_on_host(uint32_t host_index) const {
  std::vector<std::string> out;
  for (const auto& b : backends_) {
    if (b.host == host_index) out.push_back(b.name);
  }
  return out;
}

std::span<const Holder> PrefixIndex::holders(uint64_t seq_hash) const {
  auto it = blocks_.find(seq_hash);
  if (it == blocks_.end()) return {};
  return {it->second.data(), it->second.size()};
}

void PrefixIndex::lookup(std::span<const uint64_t> seq_hashes, std::vector<std::span<const Holder>>& out) const {
  out.clear();
  for (uint64_t h : seq_hashes) {
    auto it = blocks_.find(h);
    if (it == blocks_.end()) break;
    out.emplace_back(it->second.data(), it->second.size());
  }
}

Status PrefixIndex::resync(uint32_t s) {
  Stream& stream = streams_[s];
  if (resync_ == nullptr) {
    stream.stale = true;
    ++counters_.resync_failures;
    return error(Code::kUnavailable,
                 "prefix index: stream '" + stream.name + "' lost events and no resync source is configured");
  }
  Result<IndexSnapshot> snap = resync_->snapshot(stream.name);
  if (!snap.is_ok()) {
    stream.stale = true;
    ++counters_.resync_failures;
    return snap.status().with_context("prefix index resync of stream '" + stream.name + "'");
  }
  // What the stream's backends held before, to count what the snapshot changes (reconciliation).
  std::unordered_map<uint32_t, std::unordered_set<uint64_t>> before;
  for (uint32_t b = 0; b < backends_.size(); ++b) {
    if (backends_[b].stream != s) continue;
    auto& held = before[b];
    held = backends_[b].hashes;
    for (const auto& [h, m] : backends_[b].parked) held.insert(h);
    remove_backend(backends_[b].name);
  }
  std::unordered_map<uint32_t, std::unordered_set<uint64_t>> after;
  for (const auto& e : snap->entries) {
    uint32_t b = intern_backend(e.backend_id);
    backends_[b].stream = s;
    add_holder(e.seq_hash, Holder{b, e.medium});
    after[b].insert(e.seq_hash);
  }
  for (const auto& [b, held] : before) {
    auto now = after.find(b);
    for (uint64_t h : held) counters_.resync_stale_replicas += now == after.end() || !now->second.contains(h) ? 1 : 0;
  }
  for (const auto& [b, held] : after) {
    auto was = before.find(b);
    for (uint64_t h : held)
      counters_.resync_missing_replicas += was == before.end() || !was->second.contains(h) ? 1 : 0;
  }
  streams_[s].last_event_id = snap->as_of_event_id;
  streams_[s].stale = false;
  ++counters_.resyncs;
  return Status::ok();
}

Status PrefixIndex::apply(const proto::KvEvent& event, const std::string& stream_name) {
  uint32_t s = intern_stream(stream_name);
  const uint64_t id = event.event_id;
  // A new incarnation of the publisher numbers its events afresh and may not know what the old one did.
  bool restarted = false;
  if (event.incarnation != 0) {
    if (streams_[s].incarnation != 0 && streams_[s].incarnation != event.incarnation) {
      restarted = true;
      ++counters_.publisher_restarts;
      streams_[s].last_event_id = 0;
      MC_LOG_INFO << "prefix index: the publisher of stream '" << streams_[s].name
                  << "' restarted (new incarnation); resyncing its blocks";
    }
    streams_[s].incarnation = event.incarnation;
  }
  if (id != 0) {
    uint64_t last = streams_[s].last_event_id;
    if (id <= last) {
      ++counters_.events_duplicate;
      return Status::ok();
    }
    if (id != last + 1 || streams_[s].stale || restarted) {
      if (id != last + 1 && !restarted) ++counters_.gaps;
      Status st = resync(s);
      if (!st.is_ok()) {
        MC_LOG_WARN << st.message() << "; applying event " << id << " on a possibly stale index";
      } else if (id <= streams_[s].last_event_id) {
        return Status::ok();  // the snapshot already contains it
      }
    }
    streams_[s].last_event_id = id;
  }

  Medium medium = Medium::kCpu;
  bool any_medium = event.medium.empty();
  if (!any_medium) {
    Result<Medium> m = parse_medium(event.medium);
    if (!m.is_ok()) {
      ++counters_.bad_events;
      return m.status().with_context("KV event " + std::to_string(id) + " from '" + event.backend_id + "'");
    }
    medium = *m;
  }
  if (event.type == proto::kKvEventStored) {
    uint32_t b = intern_backend(event.backend_id);
    backends_[b].stream = s;
    for (uint64_t h : event.seq_hashes) add_holder(h, Holder{b, medium});
  } else if (event.type == proto::kKvEventRemoved) {
    auto it = backend_ids_.find(event.backend_id);
    if (it != backend_ids_.end()) {
      for (uint64_t h : event.seq_hashes) {
        if (any_medium) {
          for (Medium m : {Medium::kGpu, Medium::kCpu, Medium::kDisk}) remove_holder(h, Holder{it->second, m});
        } else {
          remove_holder(h, Holder{it->second, medium});
        }
      }
    }
  } else if (event.type == proto::kKvEventCleared) {
    remove_backend(event.backend_id);
  } else {
    ++counters_.bad_events;
    return error(Code::kInvalidArgument, "KV event " + std::to_string(id) + ": unknown type '" + event.type +
                                             "' (expected stored, removed or cleared)");
  }
  ++counters_.events_applied;
  return Status::ok();
}

Status PrefixIndex::resync_stale() {
  Status first;
  for (uint32_t s = 0; s < streams_.size(); ++s) {
    if (!streams_[s].stale) continue;
    Status st = resync(s);
    if (!st.is_ok() && first.is_ok()) first = st;
  }
  return first;
}

void PrefixIndex::source_restarted(uint64_t incarnation) {
  bool any = false;
  for (Stream& s : streams_) {
    if (incarnation != 0 && s.incarnation == incarnation) continue;  // its events said so first
    s.stale = true;
    s.last_event_id = 0;
    s.incarnation = 0;  // the next event's is the new one
    any = true;
  }
  if (any) ++counters_.publisher_restarts;
}

void PrefixIndex::expect_stream(const std::string& stream) {
  Stream& s = streams_[intern_stream(stream)];
  s.stale = true;
  s.last_event_id = 0;
}

bool PrefixIndex::stale(const std::string& stream) const {
  auto it = stream_ids_.find(stream);
  return it != stream_ids_.end() && streams_[it->second].stale;
}

}  // namespace mc::sched
