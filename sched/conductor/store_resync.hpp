// The Conductor's link to the store master (internal to mc_conductor): the prefix index's ResyncSource, which
// rebuilds the index from the master's listing after lost KV events, and the hosts of the master's segments.
// Thread-safety: the Conductor's loop thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "mc/common/block_key.hpp"
#include "mc/common/clock.hpp"
#include "mc/common/log.hpp"
#include "mc/net/rpc.hpp"
#include "mc/proto/store.hpp"
#include "mc/sched/prefix_index.hpp"
#include "mc/sched/scheduler.hpp"

namespace mc::sched {

// Rebuilds the prefix index from the store master (store.stat for the event id and segment hosts,
// store.ls for the blocks of every key namespace: requests choose theirs, and seq hashes of different
// namespaces differ, so blocks of any namespace only ever match requests of it). Failures are
// rate-limited to one attempt a second.
class StoreMasterResync final : public ResyncSource {
 public:
  StoreMasterResync(std::string endpoint, int timeout_ms, Scheduler* scheduler)
      : endpoint_(std::move(endpoint)), timeout_ms_(timeout_ms), scheduler_(scheduler) {}

  // Another store master leads (etcd): ask it from now on.
  void set_endpoint(const std::string& endpoint) {
    if (endpoint == endpoint_) return;
    endpoint_ = endpoint;
    client_.reset();
    last_failure_ns_ = 0;
  }

  Result<IndexSnapshot> snapshot(const std::string& stream) override {
    const int64_t now = RealClock::instance().now_ns();
    if (last_failure_ns_ != 0 && now - last_failure_ns_ < 1'000'000'000) {
      return error(Code::kUnavailable, "store master " + endpoint_ + " failed less than 1 s ago; retrying later");
    }
    Result<IndexSnapshot> snap = fetch(stream);
    last_failure_ns_ = snap.is_ok() ? 0 : now;
    return snap;
  }

  // Segment -> host from store.stat (also refreshed periodically, so same-host pricing sees new nodes).
  Result<proto::StoreStatReply> refresh_hosts() {
    MC_RETURN_IF_ERROR(connect());
    Result<proto::StoreStatReply> st = client_->call(proto::StoreStatRequest{true}, timeout_ms_);
    if (!st.is_ok()) {
      client_.reset();
      return st.status();
    }
    apply_stat(*st);
    return st;
  }

  // What a store.stat reply tells the index: segment hosts, suspect segments (parked), a restarted master.
  void apply_stat(const proto::StoreStatReply& st) {
    // A restarted master (another publisher incarnation), even one with no event to send yet: every block the
    // index has from the old one is checked against the new one's (field report 24).
    if (st.events_incarnation != 0 && master_incarnation_ != 0 && st.events_incarnation != master_incarnation_) {
      MC_LOG_WARN << "store master " << endpoint_
                  << " restarted (new KV-event incarnation): resyncing the prefix index";
      scheduler_->index().source_restarted(st.events_incarnation);
      rebuild_until_ns_ = RealClock::instance().now_ns() + kRebuildWaitNs;
    }
    if (st.events_incarnation != 0) master_incarnation_ = st.events_incarnation;
    for (const auto& seg : st.segments) {
      if (!seg.host.empty()) scheduler_->set_backend_host(seg.segment, seg.host);
      // A suspect node's replicas are not offered for reads: no plan counts on them until it is back.
      const bool was_offline = scheduler_->index().backend_offline(seg.segment);
      const size_t moved = scheduler_->index().set_backend_offline(seg.segment, seg.suspect);
      if (was_offline != seg.suspect) {
        MC_LOG_INFO << "prefix index: segment " << seg.segment << (seg.suspect ? " is suspect: " : " is back: ")
                    << moved << " replicas " << (seg.suspect ? "parked" : "offered again");
      }
    }
  }

 private:
  Status connect() {
    if (client_) return Status::ok();
    rpc::ClientOptions o;
    o.client_name = "mc-conductor";
    o.connect_timeout_ms = timeout_ms_;
    o.default_timeout_ms = timeout_ms_;
    MC_ASSIGN_OR_RETURN(client_, rpc::RpcClient::connect(endpoint_, o));
    return Status::ok();
  }

  Result<IndexSnapshot> fetch(const std::string& stream) {
    MC_ASSIGN_OR_RETURN(proto::StoreStatReply st, refresh_hosts());
    // A restarted master rebuilds its metadata from the nodes' reports: a listing taken before they are in
    // would drop (and count as stale) replicas that are only late. Wait for them, kRebuildWaitNs at most.
    if (st.suspect_nodes > 0 && RealClock::instance().now_ns() < rebuild_until_ns_) {
      return error(Code::kUnavailable, "store master " + endpoint_ + " restarted and " +
                                           std::to_string(st.suspect_nodes) +
                                           " of its nodes are still re-reporting: the resync waits for them");
    }
    // Block keys (block_key.hpp BlockStoreKey): every namespace's, page by page (the master answers at most
    // proto::kStoreLsPageObjects per call), kMaxResyncObjects at most.
    constexpr size_t kMaxResyncObjects = 400'000;
    proto::StoreLsRequest ls;
    ls.prefix = "kv/";
    ls.limit = proto::kStoreLsPageObjects;
    Result<proto::StoreLsReply> objs = proto::StoreLsReply{};
    while (true) {
      Result<proto::StoreLsReply> page = client_->call(ls, timeout_ms_);
      if (!page.is_ok()) {
        client_.reset();
        return page.status().with_context("resync of KV-event stream '" + stream + "' from " + endpoint_);
      }
      objs->truncated = page->truncated;
      if (page->objects.empty()) break;
      ls.start_after = page->objects.back().key;
      for (auto& o : page->objects) objs->objects.push_back(std::move(o));
      if (!page->truncated || objs->objects.size() >= kMaxResyncObjects) break;
    }
    if (objs->truncated) {
      MC_LOG_WARN << "resync from " << endpoint_ << ": store.ls stopped at " << objs->objects.size()
                  << " objects; the prefix index misses the rest until their next events";
    }
    IndexSnapshot snap;
    snap.as_of_event_id = st.last_event_id;
    for (const auto& o : objs->objects) {
      if (!o.complete) continue;
      const std::optional<BlockStoreKey> block = BlockStoreKey::parse(o.key);
      if (!block) continue;
      const uint64_t h = block->seq_hash;
      for (size_t i = 0; i < o.segments.size(); ++i) {
        Medium m = Medium::kCpu;
        if (i < o.media.size()) {
          Result<Medium> pm = parse_medium(o.media[i]);
          if (pm.is_ok()) m = *pm;
        }
        snap.entries.push_back(SnapshotEntry{h, o.segments[i], m});
      }
    }
    MC_LOG_INFO << "prefix index resynced from " << endpoint_ << ": " << snap.entries.size() << " replicas as of event "
                << snap.as_of_event_id;
    return snap;
  }

  std::string endpoint_;
  int timeout_ms_;
  Scheduler* scheduler_;
  std::unique_ptr<rpc::RpcClient> client_;
  int64_t last_failure_ns_ = 0;
  uint64_t master_incarnation_ = 0;  // StoreStatReply::events_incarnation last seen
  static constexpr int64_t kRebuildWaitNs = 15'000'000'000;
  int64_t rebuild_until_ns_ = 0;  // after a master restart: resyncs wait for re-reporting nodes until then
};

}  // namespace mc::sched
