// The admin subcommands of mc-store (put, get, rm, ls, stat, watch): thin wrappers over Client that
// print data on `out` (tables with units in the headers by default, JSON with --json) and return a
// Status that the tool maps to its exit code. Thread-safety: one call at a time.
#pragma once

#include <cstdint>
#include <istream>
#include <ostream>
#include <string>
#include <vector>

#include "mc/common/status.hpp"
#include "mc/store/client.hpp"

namespace mc::store {

struct AdminOptions {
  ClientOptions client;
  bool json = false;
};

// Stores the bytes of `file` ("-" = stdin) under key (write.overwrite, write.pin, write.pin_ttl_ms).
Status admin_put(const AdminOptions& options, const std::string& key, const std::string& file,
                 const WriteOptions& write);
// Writes the object's bytes to `out` (a miss is kObjectNotFound and writes nothing).
Status admin_get(const AdminOptions& options, const std::string& key, std::ostream& out);
Status admin_rm(const AdminOptions& options, const std::string& key, std::ostream& out);
// Pins (pin = true; ttl_ms 0: until unpin, > 0: soft pin) or unpins every key. Every key is tried; the result
// is the first failure (kObjectNotFound naming an absent key; the other keys are still done), else ok and,
// with --json, {"pinned": [keys], "ttl_ms": n} or {"unpinned": [keys]} on `out`.
Status admin_pin(const AdminOptions& options, const std::vector<std::string>& keys, bool pin, int64_t ttl_ms,
                 std::ostream& out);
Status admin_ls(const AdminOptions& options, const std::string& prefix, uint32_t limit, std::ostream& out);
// Per segment and medium: capacity, used, objects, hits, evictions, demotions, leases; totals.
Status admin_stat(const AdminOptions& options, std::ostream& out);
// Quotas per tenant (docs/SECURITY.md "Quotas (issue 51)"): set (admin role) and list (usage and limits; a tenant's
// key sees its own row only).
Status admin_quota_set(const AdminOptions& options, const std::string& tenant, const std::string& limits,
                       std::ostream& out);
Status admin_quota_ls(const AdminOptions& options, std::ostream& out);
struct WatchOptions {
  std::string events = "tcp://127.0.0.1:7451";  // the master's KV event endpoint (ignored with etcd)
  std::string etcd, cluster_id;                 // a replicated master: the leader's event stream is followed
  uint64_t count = 0;                           // stop after this many events (0: never)
  int64_t timeout_ms = 0;                       // stop after this long without one (0: never)
  int64_t leader_wait_ms = 5000;                // with etcd: how long to wait for a leader at start
};
// Prints KV events as JSONL on `out` until `count` events, `timeout_ms` without one or a stop signal. With etcd the
// stream is the leader's: at every takeover the watch subscribes to the new leader's endpoint and says so on `err`
// (events published while no master led are not replayed; the new leader's incarnation tells a reader to rebuild).
// kUnavailable naming the cluster when no leader is found at start (a bad leader key: named, with the remedy).
Status admin_watch(const WatchOptions& options, std::ostream& out, std::ostream& err);

}  // namespace mc::store
