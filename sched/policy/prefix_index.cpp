#include "mc/sched/prefix_index.hpp"

#include <algorithm>

#include "mc/common/log.hpp"

namespace mc::sched {

uint32_t PrefixIndex::intern_backend(const std::string& name) {
  auto it = backend_ids_.find(name);
  if (it != backend_ids_.end()) return it->second;
  auto idx = static_cast<uint32_t>(backends_.size());
  backends_.push_back(Backend{name, kUnknownHost, UINT32_MAX, {}});
  backend_ids_.emplace(name, idx);
  return idx;
}

uint32_t PrefixIndex::intern_stream(const std::string& name) {
  auto it = stream_ids_.find(name);
  if (it != stream_ids_.end()) return it->second;
  auto idx = static_cast<uint32_t>(streams_.size());
  streams_.push_back(Stream{name, 0, false});
  stream_ids_.emplace(name, idx);
  return idx;
}

void PrefixIndex::add_holder(uint64_t seq_hash, Holder h) {
  auto& v = blocks_[seq_hash];
  if (std::find(v.begin(), v.end(), h) != v.end()) return;
  v.push_back(h);
  ++holder_entries_;
  backends_[h.backend].hashes.insert(seq_hash);
}

void PrefixIndex::remove_holder(uint64_t seq_hash, Holder h) {
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
  for (auto& b : backends_) {
    if (b.stream == s) remove_backend(b.name);
  }
  for (const auto& e : snap->entries) {
    uint32_t b = intern_backend(e.backend_id);
    backends_[b].stream = s;
    add_holder(e.seq_hash, Holder{b, e.medium});
  }
  streams_[s].last_event_id = snap->as_of_event_id;
  streams_[s].stale = false;
  ++counters_.resyncs;
  return Status::ok();
}

Status PrefixIndex::apply(const proto::KvEvent& event, const std::string& stream_name) {
  uint32_t s = intern_stream(stream_name);
  const uint64_t id = event.event_id;
  if (id != 0) {
    uint64_t last = streams_[s].last_event_id;
    if (id <= last) {
      ++counters_.events_duplicate;
      return Status::ok();
    }
    if (id != last + 1 || streams_[s].stale) {
      if (id != last + 1) ++counters_.gaps;
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

bool PrefixIndex::stale(const std::string& stream) const {
  auto it = stream_ids_.find(stream);
  return it != stream_ids_.end() && streams_[it->second].stale;
}

}  // namespace mc::sched
