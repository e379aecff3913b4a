// The leader of a replicated service, named in etcd (issue 21; DESIGN.md §17): its key /mc/<cluster-id>/leader holds a
// LeaderInfo (JSON) written with the leader's etcd lease, so it vanishes when the leader stops renewing. The store
// master (store/master_ha.hpp) writes it; clients, storage nodes, workers and the Conductor resolve the master with
// LeaderLocator, which reads the key once and then watches it, so a takeover is known the moment etcd records it.
//
// Thread-safety: LeaderLocator is thread-safe (one is shared by every connection of a process); the codecs are pure.
// Errors: kInvalidArgument for a bad cluster id or etcd endpoint list; kUnavailable naming the cluster when no leader
// is elected, or etcd does not answer, within the wait. A leader key that names no live leader (check_leader_key:
// no lease, not a record, a bad endpoint) is followed as no leader; the kUnavailable then names the key, what is wrong
// with it and the remedy (a peer's bad record is a runtime error, never a usage one).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "mc/common/status.hpp"

namespace mc {

// What the leader key says (JSON in etcd): where the leader serves.
struct LeaderInfo {
  std::string member;    // "<hostname>-<pid>": who holds it
  std::string endpoint;  // the leader's RPC endpoint (ZeroMQ)
  std::string events;    // its KV event PUB endpoint ("" when off)
  uint16_t fast_port = 0;
  int64_t since_unix_ms = 0;  // when it became leader
  int64_t revision = 0;       // etcd revision of its election: the key's mod_revision (filled by readers, not stored)
};
std::string encode_leader(const LeaderInfo& info);
// kDataLoss naming what is wrong: not a JSON object with a string "endpoint", or an endpoint (or a non-empty events
// endpoint) that does not parse.
Result<LeaderInfo> decode_leader(std::string_view json);
// The leader key `key` as etcd holds it (its value and its lease): a live leader's record, or kDataLoss naming the key
// and what is wrong (the value does not decode, or the key carries no lease: a leader always holds its key under its
// lease, so a leaseless key, written by hand or by a tool, cannot be a live leader's).
Result<LeaderInfo> check_leader_key(const std::string& key, std::string_view value, int64_t lease);
// What an operator does about a key check_leader_key() refuses, for messages.
std::string leader_key_remedy(const std::string& key);

// Cluster ids: 1 to 64 of [A-Za-z0-9._-] (--cluster-id / MC_CLUSTER_ID).
Status validate_cluster_id(const std::string& id);
std::string leader_key(const std::string& cluster_id);  // "/mc/<id>/leader"

// Where a service is: a fixed endpoint, or the leader of a cluster in etcd (then `endpoint` is ignored).
struct LeaderAddress {
  std::string endpoint;
  std::string etcd;        // "HOST:PORT[,...]" (--etcd / MC_ETCD)
  std::string cluster_id;  // --cluster-id / MC_CLUSTER_ID
};

class LeaderLocator {
 public:
  // kInvalidArgument for a bad cluster id or etcd endpoint list. Does not wait for a leader.
  static Result<std::shared_ptr<LeaderLocator>> create(const LeaderAddress& address, int64_t etcd_timeout_ms = 1000);
  ~LeaderLocator();

  bool follows_etcd() const;
  // The leader now; with etcd, waits up to wait_ms for one to be elected (kUnavailable naming the cluster when
  // none is). A fixed address: {endpoint} at once.
  Result<LeaderInfo> leader(int64_t wait_ms) const;
  // Grows by one at every change of the leader key (0 for a fixed address).
  uint64_t generation() const;
  // Waits up to wait_ms for the generation to pass `seen`; true when it did.
  bool wait_change(uint64_t seen, int64_t wait_ms) const;
  // "tcp://HOST:PORT" or "cluster NAME (etcd HOST:PORT,...)", for messages.
  std::string describe() const;

 private:
  struct Impl;
  explicit LeaderLocator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mc
