#include "mc/store/master_core.hpp"

#include <algorithm>
#include <charconv>
#include <set>
#include <tuple>

#include "master_core_internal.hpp"
#include "mc/common/block_key.hpp"
#include "mc/common/log.hpp"
#include "mc/proto/kv_events.hpp"
#include "mc/proto/store.hpp"
#include "mc/store/checksum.hpp"

namespace mc::store {

Result<Medium> parse_segment_medium(std::string_view name) {
  Result<Medium> medium = parse_medium(name);
  if (medium.is_ok() && *medium == Medium::kGpu) {
    return Status(Code::kInvalidArgument, "segment medium 'gpu' is not pooled by the store: use cpu or disk");
  }
  return medium;
}

MasterCore::MasterCore(MasterConfig config, const Clock* clock) : config_(config), clock_(clock) {}

Status MasterCore::validate_key(const std::string& key) const {
  if (key.empty()) return Status(Code::kInvalidArgument, "empty object key");
  if (key.size() > config_.max_key_bytes) {
    return Status(Code::kInvalidArgument, "object key of " + std::to_string(key.size()) +
                                              " bytes exceeds the limit of " + std::to_string(config_.max_key_bytes) +
                                              " bytes");
  }
  // Keys are printed by `mc-store ls` and logged: no control characters, which would forge lines or hide text in
  // an operator's terminal (a tester's finding, issue 51).
  for (const char c : key) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return Status(Code::kInvalidArgument, "object key holds a control character (byte " +
                                                std::to_string(static_cast<unsigned char>(c)) + "): not accepted");
    }
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
    account(obj, -1);
    obj.pinned = false;
    obj.pin_until_ns = 0;
    account(obj, +1);
    ++counters_.expired_pins;
  }
  return false;
}

void MasterCore::touch_client(const std::string& client_id) {
  if (!client_id.empty()) clients_[client_id] = clock_->now_ns();
}

void MasterCore::emit(const char* type, const std::string& key, const std::string& segment) {
  std::optional<BlockStoreKey> block = BlockStoreKey::parse(key);
  if (!block) return;  // only block keys are announced (the index is of prefix hashes)
  auto seg = segments_.find(segment);
  proto::KvEvent e;
  e.type = type;
  e.ts_unix_ms = unix_time_ms();
  e.seq_hashes = {block->seq_hash};
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
  // Quotas: the tenant is charged for the replicas it asks for.
  const uint64_t charged = size_bytes * want;
  bool quota_checked = false;
  auto it = objects_.find(key);
  if (it != objects_.end()) {
    Object& obj = it->second;
    if (obj.complete) {
      if (!options.overwrite) return Status(Code::kAlreadyExists, "object '" + key + "' already exists");
      if (leased(obj))
        return Status(Code::kObjectBusy, "object '" + key + "' is leased by a reader; retry after its lease");
      // Checked before the old object goes (its charge credited): a refused overwrite leaves it in place.
      MC_RETURN_IF_ERROR(check_quota(key, options.tenant, charged, options.pin, &obj));
      quota_checked = true;
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
  if (!quota_checked) MC_RETURN_IF_ERROR(check_quota(key, options.tenant, charged, options.pin, nullptr));
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
  obj.owner = options.tenant;
  obj.charged_bytes = charged;
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
  account(obj, +1);
  if (auto [at, added] = objects_.insert_or_assign(key, std::move(obj)); added) index_add(at);
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
  account(obj, -1);
  obj.complete = true;
  account(obj, +1);
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

Status MasterCore::pin(const std::string& key, int64_t ttl_ms, const std::string& caller_tenant) {
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
  if (!caller_tenant.empty() && !obj.owner.empty() && obj.owner != caller_tenant) {
    return Status(Code::kPermissionDenied, "pin '" + key + "': written by tenant '" + obj.owner + "', not '" +
                                               caller_tenant +
                                               "': a tenant pins only objects it wrote (the writer's quota pays "
                                               "for them; ask that tenant to pin it)");
  }
  if (!obj.pinned) MC_RETURN_IF_ERROR(check_quota(key, obj.owner, obj.charged_bytes, true, nullptr, true));
  account(obj, -1);
  obj.pinned = true;
  obj.pin_until_ns = ttl_ms > 0 ? clock_->now_ns() + ttl_ms * kNsPerMs : 0;
  account(obj, +1);
  pinned_keys_.insert(key);
  dirty(key);
  return Status::ok();
}

Status MasterCore::unpin(const std::string& key) {
  MC_RETURN_IF_ERROR(validate_key(key));
  auto it = objects_.find(key);
  if (it == objects_.end()) return Status(Code::kObjectNotFound, "unpin '" + key + "': object not found");
  account(it->second, -1);
  it->second.pinned = false;
  it->second.pin_until_ns = 0;
  account(it->second, +1);
  pinned_keys_.erase(key);
  dirty(key);
  return Status::ok();
}

std::vector<ObjectInfo> MasterCore::ls(const std::string& prefix, size_t limit, const std::string& start_after,
                                       size_t max_bytes, bool* more) const {
  std::vector<ObjectInfo> out;
  if (more != nullptr) *more = false;
  size_t bytes = 0;
  auto it = start_after.empty() || start_after < prefix ? key_order_.lower_bound(prefix)
                                                        : key_order_.upper_bound(start_after);
  for (; it != key_order_.end() && it->compare(0, prefix.size(), prefix) == 0; ++it) {
    if (out.size() >= limit || (!out.empty() && bytes >= max_bytes)) {
      if (more != nullptr) *more = true;
      break;
    }
    const Object& obj = objects_.at(std::string(*it));
    ObjectInfo info;
    info.key = std::string(*it);
    info.size_bytes = obj.size_bytes;
    info.complete = obj.complete;
    info.leased = leased(obj);
    info.pinned = pinned(obj);
    bytes += info.key.size() + 32;
    for (const Replica& r : obj.replicas) {
      if (!r.complete) continue;
      info.segments.push_back(r.segment);
      info.media.emplace_back(medium_name(segments_.at(r.segment).info.medium));
      bytes += r.segment.size() + 8;
    }
    out.push_back(std::move(info));
  }
  return out;
}

void MasterCore::credit_loop_stall(int64_t stall_ms) {
  if (stall_ms <= 0) return;
  const int64_t now = clock_->now_ns();
  for (auto& [id, node] : nodes_) node.last_heartbeat_ns = std::min(now, node.last_heartbeat_ns + stall_ms * kNsPerMs);
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
  s.pending_free_bytes = pending_free_bytes_;
  for (const std::string& k : pinned_keys_) {
    auto it = objects_.find(k);
    if (it == objects_.end() || !it->second.complete || !pinned(it->second)) continue;
    ++s.pinned_objects;
    s.pinned_bytes += it->second.size_bytes;
  }
  s.nodes = nodes_.size();
  for (const auto& [id, node] : nodes_) s.suspect_nodes += node.suspect || node.reporting ? 1 : 0;
  s.clients = clients_.size();
  s.tenants = tenant_stats();
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
      // A tenant's unfinished put expires after put_takeover_ms (its write grant's lifetime): an abandoned put
      // holds neither the tenant's quota nor the pool's space longer than that (issue 51).
      const int64_t reclaim_ms =
          obj.owner.empty() ? config_.put_reclaim_ms : std::min(config_.put_reclaim_ms, config_.put_takeover_ms);
      if (dead_clients.count(obj.writer) || now - obj.started_ns > reclaim_ms * kNsPerMs) {
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
  while (!pending_frees_.empty() && pending_frees_.front().release_ns <= now) {
    std::pop_heap(pending_frees_.begin(), pending_frees_.end(), ReleasesLater{});
    const PendingFree& p = pending_frees_.back();
    auto seg = segments_.find(p.segment);
    if (seg != segments_.end()) (void)seg->second.alloc->free(p.offset);
    pending_free_bytes_ -= p.size_bytes;
    pending_frees_.pop_back();
  }
  // Watermarks.
  for (auto& [name, seg] : segments_) {
    double cap = static_cast<double>(seg.alloc->capacity_bytes());
    if (static_cast<double>(seg.alloc->used_bytes()) > config_.high_watermark * cap) {
      evict(name, static_cast<uint64_t>(config_.low_watermark * cap));
    }
  }
}

}  // namespace mc::store
