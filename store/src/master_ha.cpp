#include "mc/store/master_ha.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "mc/common/clock.hpp"
#include "mc/common/log.hpp"
#include "mc/proto/codec.hpp"
#include "mc/proto/transfer.hpp"
#include "mc/store/checksum.hpp"

namespace mc::store {

namespace {

// etcd's default --max-txn-ops is 128: a commit is cut into transactions of at most this many operations.
constexpr size_t kMaxOpsPerTxn = 120;
// And at most this many bytes of keys and values per transaction (JSON gateway: base64, 4/3 of it), under etcd's
// default request limit of 1.5 MiB; one record larger than that goes alone.
constexpr size_t kMaxTxnBytes = 768 * 1024;
// A full read is paged (etcd answers a range in one message).
constexpr int64_t kRangePage = 5000;
// Bounds of the fields of a record (a peer's input): names, and times on the wall clock (year 2500).
constexpr size_t kMaxRecordNameBytes = 1024;
constexpr int64_t kMaxRecordUnixMs = int64_t{16'725'225'600'000};

// A record as the standby keeps it: the object with its soft pin's end on the wall clock.
struct HeldObject {
  DurableObject object;
  int64_t pin_until_unix_ms = 0;  // with object.pinned: 0 = hard pin
  int64_t mod_revision = 0;       // etcd revision of the record's last write (the follower sets it)
};

Result<HeldObject> decode_held_object(const std::string& key, std::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  const auto bad = [&](const std::string& why) {
    return Status(Code::kDataLoss, "object record '" + key.substr(0, 120) + "': " + why);
  };
  if (!j.is_object()) return bad("not a JSON object");
  HeldObject h;
  DurableObject& o = h.object;
  o.key = key;
  const auto u64 = [&](const char* name, uint64_t& out) {
    auto it = j.find(name);
    if (it == j.end() || !it->is_number_unsigned()) return false;
    out = it->get<uint64_t>();
    return true;
  };
  if (!u64("size", o.size_bytes) || !u64("checksum", o.checksum)) return bad("size or checksum missing");
  auto complete = j.find("complete");
  if (complete == j.end() || !complete->is_boolean()) return bad("'complete' missing");
  o.complete = complete->get<bool>();
  auto pinned = j.find("pinned");
  o.pinned = pinned != j.end() && pinned->is_boolean() && pinned->get<bool>();
  auto owner = j.find("owner");
  if (owner != j.end() && owner->is_string() && owner->get_ref<const std::string&>().size() <= 64) {
    o.owner = owner->get<std::string>();
  }
  auto until = j.find("pin_until_unix_ms");
  if (until != j.end() && until->is_number_integer()) h.pin_until_unix_ms = until->get<int64_t>();
  // Bounds: a record is a peer's input (anyone with write access to etcd); no value may overflow what is computed
  // from it.
  if (h.pin_until_unix_ms < 0 || h.pin_until_unix_ms > kMaxRecordUnixMs) return bad("'pin_until_unix_ms' out of range");
  if (o.size_bytes == 0 || o.size_bytes > kMaxSegmentCapacityBytes) return bad("'size' out of range");
  // Part checksums (optional): parts that are malformed or do not fit the size are dropped, not the record (its
  // ranges are then read whole and checked against the object's checksum).
  auto parts = j.find("parts");
  if (parts != j.end() && parts->is_array() && parts->size() <= kMaxObjectParts && u64("part_bytes", o.part_bytes)) {
    for (const auto& p : *parts) {
      if (!p.is_number_unsigned()) {
        o.part_checksums.clear();
        break;
      }
      o.part_checksums.push_back(p.get<uint64_t>());
    }
    if (!parts_fit(o.size_bytes, o.part_bytes, o.part_checksums.size())) o.part_checksums.clear();
  }
  if (o.part_checksums.empty()) o.part_bytes = 0;
  auto reps = j.find("replicas");
  if (reps == j.end() || !reps->is_array() || reps->size() > 64) return bad("'replicas' missing or too long");
  for (const nlohmann::json& r : *reps) {
    if (!r.is_array() || r.size() != 3 || !r[0].is_string() || !r[1].is_number_unsigned() || !r[2].is_boolean()) {
      return bad("a replica is not [segment, offset, complete]");
    }
    DurableReplica rep{r[0].get<std::string>(), r[1].get<uint64_t>(), r[2].get<bool>()};
    if (rep.segment.empty() || rep.segment.size() > kMaxRecordNameBytes || rep.offset > kMaxSegmentCapacityBytes) {
      return bad("a replica names no segment, a name over " + std::to_string(kMaxRecordNameBytes) +
                 " bytes, or an offset beyond any segment");
    }
    o.replicas.push_back(std::move(rep));
  }
  return h;
}

DurableObject with_pin_left(HeldObject h, int64_t now_unix_ms) {
  DurableObject o = std::move(h.object);
  if (o.pinned && h.pin_until_unix_ms != 0) {
    o.pin_left_ms = std::min(h.pin_until_unix_ms - now_unix_ms, kMaxPinTtlMs);
    if (o.pin_left_ms <= 0) {
      o.pinned = false;
      o.pin_left_ms = 0;
    }
  }
  return o;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Keys and codecs
// ---------------------------------------------------------------------------------------------

std::string ha_prefix(const std::string& cluster_id) { return "/mc/" + cluster_id + "/"; }
std::string directory_record_key(const std::string& cluster_id, const std::string& segment) {
  return ha_prefix(cluster_id) + "xseg/" + segment;
}

std::string encode_segment_record(const DurableSegment& s) {
  const SegmentInfo& i = s.info;
  nlohmann::json j = {{"name", i.name},
                      {"node", i.node_id},
                      {"host", i.host},
                      {"domain", i.domain},
                      {"medium", std::string(medium_name(i.medium))},
                      {"capacity", i.capacity_bytes},
                      {"endpoint", i.endpoint},
                      {"xfer_segment", i.xfer_segment},
                      {"xfer_base", i.xfer_base_offset},
                      {"read_only", s.read_only}};
  return j.dump();
}

Result<DurableSegment> decode_segment_record(std::string_view json) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  const auto bad = [&](const std::string& why) {
    return Status(Code::kDataLoss, "segment record " + std::string(json.substr(0, 80)) + ": " + why);
  };
  if (!j.is_object()) return bad("not a JSON object");
  DurableSegment s;
  SegmentInfo& i = s.info;
  const auto str = [&](const char* name, std::string& out) {
    auto it = j.find(name);
    if (it == j.end() || !it->is_string()) return false;
    out = it->get<std::string>();
    return true;
  };
  std::string medium;
  if (!str("name", i.name) || !str("node", i.node_id) || !str("medium", medium)) return bad("name, node or medium");
  str("host", i.host);
  str("domain", i.domain);
  str("endpoint", i.endpoint);
  str("xfer_segment", i.xfer_segment);
  Result<Medium> m = parse_segment_medium(medium);
  if (!m.is_ok()) return bad(m.status().message());
  i.medium = m.value();
  auto cap = j.find("capacity");
  if (cap == j.end() || !cap->is_number_unsigned()) return bad("capacity missing");
  i.capacity_bytes = cap->get<uint64_t>();
  auto base = j.find("xfer_base");
  if (base != j.end() && base->is_number_unsigned()) i.xfer_base_offset = base->get<uint64_t>();
  // Bounds: a record is a peer's input (anyone with write access to etcd can forge one).
  if (i.capacity_bytes == 0 || i.capacity_bytes > kMaxSegmentCapacityBytes) {
    return bad("capacity of " + std::to_string(i.capacity_bytes) + " bytes is outside 1.." +
               std::to_string(kMaxSegmentCapacityBytes) + " (1 PiB)");
  }
  if (i.xfer_base_offset > kMaxSegmentCapacityBytes * 64) return bad("'xfer_base' beyond any transfer segment");
  for (const std::string* f : {&i.name, &i.node_id, &i.host, &i.domain, &i.endpoint, &i.xfer_segment}) {
    if (f->size() > kMaxRecordNameBytes) return bad("a name over " + std::to_string(kMaxRecordNameBytes) + " bytes");
  }
  auto ro = j.find("read_only");
  s.read_only = ro != j.end() && ro->is_boolean() && ro->get<bool>();
  return s;
}

std::string encode_object_record(const DurableObject& o, int64_t now_unix_ms) {
  nlohmann::json reps = nlohmann::json::array();
  for (const DurableReplica& r : o.replicas) reps.push_back(nlohmann::json::array({r.segment, r.offset, r.complete}));
  nlohmann::json j = {
      {"size", o.size_bytes}, {"checksum", o.checksum}, {"complete", o.complete}, {"replicas", std::move(reps)}};
  if (!o.part_checksums.empty()) {
    j["part_bytes"] = o.part_bytes;
    j["parts"] = o.part_checksums;
  }
  // The writer of a shared key, charged for it (quotas); a "tenant/T/" key is T's and needs none.
  if (!o.owner.empty() && o.key.rfind("tenant/", 0) != 0) j["owner"] = o.owner;
  if (o.pinned) {
    j["pinned"] = true;
    j["pin_until_unix_ms"] = o.pin_left_ms > 0 ? now_unix_ms + o.pin_left_ms : 0;
  }
  return j.dump();
}

Result<DurableObject> decode_object_record(const std::string& key, std::string_view json, int64_t now_unix_ms) {
  MC_ASSIGN_OR_RETURN(HeldObject h, decode_held_object(key, json));
  return with_pin_left(std::move(h), now_unix_ms);
}

// ---------------------------------------------------------------------------------------------
// MasterHa
// ---------------------------------------------------------------------------------------------

struct MasterHa::Impl {
  HaOptions options;
  LeaderInfo self;
  std::string prefix, leader_key, seg_prefix, obj_prefix, xseg_prefix;
  std::unique_ptr<etcd::Client> client;

  // The records as followed by the watch (guarded by mu).
  mutable std::mutex mu;
  std::condition_variable applied_cv;
  std::map<std::string, DurableSegment> segments;  // by segment name
  std::map<std::string, HeldObject> objects;       // by object key
  std::map<std::string, proto::SegmentDescriptor> directory;
  std::optional<LeaderInfo> leader;  // a live leader's record (check_leader_key)
  // The leader key when it names no live leader (no lease, or a value that is not a leader record): a candidate
  // replaces it, in a transaction on exactly this version of it.
  struct BadLeaderKey {
    int64_t mod_revision = 0, lease = 0;
    std::string why;
  };
  std::optional<BadLeaderKey> bad_leader;
  int64_t logged_bad_leader = 0;  // mod_revision of the bad key last logged (one error per bad key)
  int64_t applied_revision = 0;
  bool reload_needed = false;
  HaCounters counters;

  std::unique_ptr<etcd::Watch> watch;

  // Leadership. lease is renewed by the lease thread; lease_until_ms is when it surely still holds (steady clock).
  std::atomic<int64_t> lease{0};
  std::atomic<int64_t> lease_until_ms{0};
  std::atomic<bool> leading{false};
  std::atomic<int64_t> key_lease{0};  // the lease the leader key carries, as the watch last saw it (0: none)
  std::mutex lease_mu;
  std::condition_variable lease_cv;
  bool stopping = false;
  std::thread lease_thread;

  int64_t next_compact_ms = 0;
  int64_t next_reload_ms = 0;  // maintain(): the next read of the records while etcd does not answer
  uint64_t reload_failures = 0;
  int64_t compact_mark = 0;

  int64_t margin_ms() const { return std::max<int64_t>(200, options.lease_ttl_s * 1000 / 4); }

  // Applies one record (put: value; delete: nullopt) to the followed copy. Caller holds mu.
  void apply(const std::string& key, const std::optional<std::string>& value, int64_t mod_revision,
             int64_t lease_of_key = 0) {
    if (key == leader_key) {
      key_lease = value ? lease_of_key : 0;  // whoever wrote it: is_leader() checks it is still this member's
      bad_leader.reset();
      leader.reset();
      if (!value) return;
      // A leader holds its key under its lease and writes a valid record: anything else is no live leader (written
      // by hand or by a tool) and must not block the election forever.
      Result<LeaderInfo> info = check_leader_key(key, *value, lease_of_key);
      if (info.is_ok()) {
        leader = info.value();
        leader->revision = mod_revision;
      } else {
        bad_leader = BadLeaderKey{mod_revision, lease_of_key, info.status().message()};
      }
      return;
    }
    const auto corrupt = [&](const Status& s) {
      ++counters.corrupt_records;
      MC_LOG_ERROR << "etcd record " << key.substr(0, 160) << " skipped (" << s.message()
                   << "); the others are kept (mc_store_ha_corrupt_records_total counts them)";
    };
    if (key.rfind(obj_prefix, 0) == 0) {
      const std::string name = key.substr(obj_prefix.size());
      if (!value) {
        objects.erase(name);
        return;
      }
      Result<HeldObject> h = decode_held_object(name, *value);
      if (h.is_ok()) {
        h->mod_revision = mod_revision;
        objects[name] = std::move(h).value();
      } else {
        objects.erase(name);
        corrupt(h.status());
      }
    } else if (key.rfind(seg_prefix, 0) == 0) {
      const std::string name = key.substr(seg_prefix.size());
      if (!value) {
        segments.erase(name);
        return;
      }
      Result<DurableSegment> s = decode_segment_record(*value);
      if (s.is_ok() && s->info.name == name) {
        segments[name] = std::move(s).value();
      } else {
        segments.erase(name);
        corrupt(s.is_ok() ? Status(Code::kDataLoss, "its name is " + s->info.name) : s.status());
      }
    } else if (key.rfind(xseg_prefix, 0) == 0) {
      const std::string name = key.substr(xseg_prefix.size());
      if (!value) {
        directory.erase(name);
        return;
      }
      Result<proto::SegmentDescriptor> d =
          codec::unpack<proto::SegmentDescriptor>(*value, "directory record " + name.substr(0, 120));
      if (d.is_ok() && d->name == name) {
        directory[name] = std::move(d).value();
      } else {
        directory.erase(name);
        corrupt(d.is_ok() ? Status(Code::kDataLoss, "its name is " + d->name) : d.status());
      }
    }
  }

  // Reads every record at one revision (paged) and follows them from there.
  Status reload() {
    watch.reset();
    std::map<std::string, std::optional<std::string>> all;
    std::map<std::string, int64_t> modified, leases;
    int64_t revision = 0;
    std::string from = prefix;
    const std::string end = etcd::prefix_end(prefix);
    for (int page = 0; page < 100000; ++page) {
      MC_ASSIGN_OR_RETURN(etcd::RangeResult r, client->range(from, end, revision, kRangePage));
      if (revision == 0) revision = r.revision;
      for (etcd::KeyValue& kv : r.kvs) {
        modified[kv.key] = kv.mod_revision;
        leases[kv.key] = kv.lease;
        all[kv.key] = std::move(kv.value);
      }
      if (!r.more || r.kvs.empty()) break;
      from = r.kvs.back().key + std::string(1, '\0');
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      segments.clear();
      objects.clear();
      directory.clear();
      leader.reset();
      bad_leader.reset();
      const uint64_t corrupt_before = counters.corrupt_records;
      for (const auto& [key, value] : all) apply(key, value, modified[key], leases[key]);
      applied_revision = revision;
      reload_needed = false;
      ++counters.watch_reloads;
      MC_LOG_INFO << "store master HA: read " << all.size() << " records of cluster " << options.cluster_id
                  << " at etcd revision " << revision << " (" << objects.size() << " objects, " << segments.size()
                  << " segments, " << (counters.corrupt_records - corrupt_before) << " skipped as corrupt)";
    }
    applied_cv.notify_all();
    etcd::Options eo = client->options();
    watch = std::make_unique<etcd::Watch>(
        eo, prefix, end, revision + 1,
        [this](const std::vector<etcd::WatchEvent>& events, int64_t rev) {
          {
            std::lock_guard<std::mutex> lock(mu);
            for (const etcd::WatchEvent& e : events) {
              if (e.type == etcd::WatchEvent::Type::kPut) {
                apply(e.kv.key, e.kv.value, e.kv.mod_revision, e.kv.lease);
              } else {
                apply(e.kv.key, std::nullopt, 0);
              }
            }
            applied_revision = std::max(applied_revision, rev);
          }
          applied_cv.notify_all();
        },
        [this](const Status& s) {
          MC_LOG_WARN << "store master HA: watch of " << prefix << " ended (" << s.to_string()
                      << "): reading every record again";
          std::lock_guard<std::mutex> lock(mu);
          reload_needed = true;
        });
    return Status::ok();
  }

  void lease_loop() {
    std::unique_lock<std::mutex> lock(lease_mu);
    while (!stopping) {
      lease_cv.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(100, options.lease_ttl_s * 1000 / 3)));
      if (stopping) break;
      const int64_t id = lease.load();
      if (id == 0) continue;
      lock.unlock();
      const int64_t sent = steady_ms();
      Result<int64_t> ttl = client->lease_keepalive(id);
      lock.lock();
      if (ttl.is_ok() && ttl.value() > 0) {
        if (lease.load() == id) lease_until_ms = sent + ttl.value() * 1000;
      } else if (!ttl.is_ok() && ttl.status().code() == Code::kNotFound) {
        if (lease.load() == id) {
          MC_LOG_WARN << "store master HA: lease " << id << " is gone at etcd (expired while this member was "
                      << "paused or cut off)";
          lease = 0;
          lease_until_ms = 0;
        }
      } else if (!ttl.is_ok()) {
        MC_LOG_WARN << "store master HA: lease renewal failed: " << ttl.status().to_string();
      }
    }
  }
};

MasterHa::MasterHa(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MasterHa::~MasterHa() {
  {
    std::lock_guard<std::mutex> lock(impl_->lease_mu);
    impl_->stopping = true;
  }
  impl_->lease_cv.notify_all();
  if (impl_->lease_thread.joinable()) impl_->lease_thread.join();
  impl_->watch.reset();
  if (impl_->leading.load() && impl_->lease.load() != 0) {
    // A clean stop hands over at once instead of after the lease's TTL.
    (void)impl_->client->lease_revoke(impl_->lease.load());
  }
}

Result<std::unique_ptr<MasterHa>> MasterHa::start(const HaOptions& options, LeaderInfo self) {
  MC_RETURN_IF_ERROR(validate_cluster_id(options.cluster_id));
  if (options.lease_ttl_s < 1 || options.lease_ttl_s > 600) {
    return Status(Code::kInvalidArgument,
                  "leader lease TTL of " + std::to_string(options.lease_ttl_s) + " s is outside 1..600");
  }
  MC_ASSIGN_OR_RETURN(etcd::Options eo, etcd::parse_endpoints(options.etcd));
  eo.timeout_ms = options.etcd_timeout_ms;
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->self = std::move(self);
  impl->prefix = ha_prefix(options.cluster_id);
  impl->leader_key = leader_key(options.cluster_id);
  impl->seg_prefix = impl->prefix + "seg/";
  impl->obj_prefix = impl->prefix + "obj/";
  impl->xseg_prefix = impl->prefix + "xseg/";
  impl->client = std::make_unique<etcd::Client>(eo);
  MC_RETURN_IF_ERROR(impl->reload().with_context("store master: first read of cluster '" + options.cluster_id +
                                                 "' from etcd " + options.etcd));
  Impl* raw = impl.get();
  impl->lease_thread = std::thread([raw] { raw->lease_loop(); });
  return std::unique_ptr<MasterHa>(new MasterHa(std::move(impl)));
}

Result<std::optional<TakeoverState>> MasterHa::campaign() {
  Impl& m = *impl_;
  bool reload = false;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    reload = m.reload_needed;
    if (!reload && m.leader) return std::optional<TakeoverState>();
  }
  if (reload) MC_RETURN_IF_ERROR(m.reload());
  std::optional<Impl::BadLeaderKey> bad;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.leader) return std::optional<TakeoverState>();
    bad = m.bad_leader;
  }
  if (m.lease.load() == 0) {
    const int64_t asked = steady_ms();
    MC_ASSIGN_OR_RETURN(int64_t id, m.client->lease_grant(m.options.lease_ttl_s));
    m.lease_until_ms = asked + m.options.lease_ttl_s * 1000;
    m.lease = id;
  }
  LeaderInfo me = m.self;
  me.since_unix_ms = unix_time_ms();
  // No key: create it. A key that names no live leader: replace exactly the version seen (its mod_revision and
  // lease), so a leader elected meanwhile is never overwritten.
  std::vector<etcd::Compare> compares;
  if (bad) {
    if (m.logged_bad_leader != bad->mod_revision) {
      m.logged_bad_leader = bad->mod_revision;
      MC_LOG_ERROR << "store master HA: " << bad->why << ": no live leader holds it, so it would block every "
                   << "election; replacing " << m.leader_key << " (etcd mod_revision " << bad->mod_revision
                   << ", lease " << bad->lease << ") with this member's record under its lease";
    }
    compares.push_back(
        {m.leader_key, etcd::Compare::Target::kModRevision, etcd::Compare::Result::kEqual, bad->mod_revision, ""});
    compares.push_back({m.leader_key, etcd::Compare::Target::kLease, etcd::Compare::Result::kEqual, bad->lease, ""});
  } else {
    compares.push_back({m.leader_key, etcd::Compare::Target::kCreateRevision, etcd::Compare::Result::kEqual, 0, ""});
  }
  Result<etcd::TxnResult> won =
      m.client->txn(compares, {etcd::Op::put(m.leader_key, encode_leader(me), m.lease.load())});
  if (!won.is_ok()) return won.status();
  if (!won->succeeded) return std::optional<TakeoverState>();
  const int64_t revision = won->revision;
  // Everything the old leader committed precedes this revision: wait until the watch has applied it.
  std::unique_lock<std::mutex> lock(m.mu);
  const bool caught_up = m.applied_cv.wait_for(lock, std::chrono::milliseconds(2 * m.options.etcd_timeout_ms),
                                               [&] { return m.applied_revision >= revision || m.reload_needed; });
  if (!caught_up || m.reload_needed) {
    lock.unlock();
    MC_LOG_WARN << "store master HA: elected at revision " << revision
                << " but the watch had not caught up: reading every record again";
    MC_RETURN_IF_ERROR(m.reload());
    lock.lock();
  }
  TakeoverState out;
  out.revision = revision;
  const int64_t now_unix = unix_time_ms();
  for (const auto& [name, s] : m.segments) out.segments.push_back(s);
  // Oldest write first: where two records claim the same bytes, the loader keeps the first (MasterCore::
  // load_durable), so a record rewritten over another object's range later (by hand, or by whoever could write
  // etcd) is the one refused, not the object that held the range before it.
  std::vector<const HeldObject*> by_age;
  by_age.reserve(m.objects.size());
  for (const auto& [key, h] : m.objects) by_age.push_back(&h);
  std::stable_sort(by_age.begin(), by_age.end(),
                   [](const HeldObject* a, const HeldObject* b) { return a->mod_revision < b->mod_revision; });
  out.objects.reserve(by_age.size());
  for (const HeldObject* h : by_age) out.objects.push_back(with_pin_left(*h, now_unix));
  for (const auto& [name, d] : m.directory) out.directory.push_back(d);
  out.corrupt_records = m.counters.corrupt_records;
  ++m.counters.takeovers;
  m.leading = true;
  m.next_compact_ms = steady_ms() + m.options.compact_interval_ms;
  m.compact_mark = revision;
  return std::optional<TakeoverState>(std::move(out));
}

bool MasterHa::is_leader() const {
  // The leader key must still be this member's (as the watch saw it last): a key deleted or overwritten behind its
  // back (by an operator or an attacker with etcd access) ends its term at once, not at its next failed write.
  return impl_->leading.load() && impl_->lease.load() != 0 && impl_->key_lease.load() == impl_->lease.load() &&
         steady_ms() < impl_->lease_until_ms.load() - impl_->margin_ms();
}

Status MasterHa::commit(const DurableChanges& changes, const std::vector<etcd::Op>& extra) {
  Impl& m = *impl_;
  if (changes.empty() && extra.empty()) return Status::ok();
  const int64_t lease = m.lease.load();
  if (!is_leader()) {
    return Status(Code::kUnavailable, "store master: not the leader any more (its etcd lease may have expired)");
  }
  std::vector<etcd::Op> ops;
  ops.reserve(changes.segments.size() + changes.objects.size() + extra.size());
  for (const auto& [name, s] : changes.segments) {
    ops.push_back(s ? etcd::Op::put(m.seg_prefix + name, encode_segment_record(*s))
                    : etcd::Op::del(m.seg_prefix + name));
  }
  const int64_t now_unix = unix_time_ms();
  for (const auto& [key, o] : changes.objects) {
    ops.push_back(o ? etcd::Op::put(m.obj_prefix + key, encode_object_record(*o, now_unix))
                    : etcd::Op::del(m.obj_prefix + key));
  }
  ops.insert(ops.end(), extra.begin(), extra.end());
  // Fenced: only while the leader key still carries this member's lease.
  const etcd::Compare fence{m.leader_key, etcd::Compare::Target::kLease, etcd::Compare::Result::kEqual, lease, ""};
  const auto t0_us = std::chrono::steady_clock::now();
  for (size_t at = 0; at < ops.size();) {
    size_t end = at, bytes = 0;
    while (end < ops.size() && end - at < kMaxOpsPerTxn &&
           (end == at || bytes + ops[end].key.size() + ops[end].value.size() <= kMaxTxnBytes)) {
      bytes += ops[end].key.size() + ops[end].value.size();
      ++end;
    }
    std::vector<etcd::Op> chunk(ops.begin() + static_cast<std::ptrdiff_t>(at),
                                ops.begin() + static_cast<std::ptrdiff_t>(end));
    at = end;
    // A transaction that failed for etcd's sake (a member killed under it, an etcd election) is sent again while
    // this member surely leads: it writes whole records, so applying it twice leaves what applying it once does, and
    // a copy of it that etcd still commits late is ordered before the retry in etcd's log (DESIGN.md §17).
    Result<etcd::TxnResult> r = m.client->txn({fence}, chunk);
    for (int attempt = 1; !r.is_ok() && attempt < 50 && is_leader(); ++attempt) {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(20 * attempt, 200)));
      MC_LOG_DEBUG << "store master HA: commit retried (" << r.status().message() << ")";
      r = m.client->txn({fence}, chunk);
    }
    if (!r.is_ok() || !r->succeeded) {
      std::lock_guard<std::mutex> lock(m.mu);
      ++m.counters.commit_failures;
      return Status(Code::kUnavailable,
                    "store master: the change could not be made durable in etcd (" +
                        (r.is_ok() ? std::string("the leader key no longer carries this member's lease: another "
                                                 "master leads")
                                   : r.status().message()) +
                        "); this master steps down: retry, the leader answers");
    }
  }
  const uint64_t us = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0_us).count());
  std::lock_guard<std::mutex> lock(m.mu);
  ++m.counters.commits;
  m.counters.commit_ops += ops.size();
  m.counters.commit_us_total += us;
  m.counters.commit_us_max = std::max(m.counters.commit_us_max, us);
  return Status::ok();
}

void MasterHa::step_down(const std::string& why) {
  Impl& m = *impl_;
  if (!m.leading.exchange(false)) return;
  MC_LOG_WARN << "store master HA: stepping down (" << why << "); following the records as a standby";
  const int64_t lease = m.lease.exchange(0);
  m.lease_until_ms = 0;
  if (lease != 0) {
    Status s = m.client->lease_revoke(lease);
    if (!s.is_ok()) MC_LOG_DEBUG << "lease revoke: " << s.to_string();
  }
  std::lock_guard<std::mutex> lock(m.mu);
  ++m.counters.step_downs;
  m.reload_needed = true;  // what this member wrote last may not be in etcd: read it back
}

std::optional<LeaderInfo> MasterHa::leader() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->leader;
}

void MasterHa::maintain() {
  Impl& m = *impl_;
  bool reload = false;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    reload = m.reload_needed && !m.leading.load();
  }
  // While etcd does not answer, a read is tried at most twice a second, and logged at the first failure and then
  // rarely (campaign() reads as well when it is due).
  if (reload && steady_ms() >= m.next_reload_ms) {
    m.next_reload_ms = steady_ms() + 500;
    Status s = m.reload();
    if (s.is_ok()) {
      m.reload_failures = 0;
    } else if (log::nth_worth_logging(++m.reload_failures)) {
      MC_LOG_WARN << "store master HA: reading the records failed (" << m.reload_failures
                  << " times in a row): " << s.to_string();
    }
  }
  if (!is_leader() || steady_ms() < m.next_compact_ms) return;
  m.next_compact_ms = steady_ms() + m.options.compact_interval_ms;
  // etcd's history before the mark of the last round is no longer needed: every standby has followed it.
  if (m.compact_mark > 0) {
    Status s = m.client->compact(m.compact_mark);
    if (!s.is_ok()) MC_LOG_DEBUG << "etcd compaction at " << m.compact_mark << ": " << s.to_string();
  }
  std::lock_guard<std::mutex> lock(m.mu);
  m.compact_mark = m.applied_revision;
}

HaCounters MasterHa::counters() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  HaCounters c = impl_->counters;
  c.applied_revision = impl_->applied_revision;
  return c;
}

void MasterHa::count_refused(uint64_t records) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->counters.corrupt_records += records;
}

const HaOptions& MasterHa::options() const { return impl_->options; }

std::string MasterHa::directory_key(const std::string& name) const {
  return directory_record_key(impl_->options.cluster_id, name);
}

}  // namespace mc::store
