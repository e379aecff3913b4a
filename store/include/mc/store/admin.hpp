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
// Prints KV events from `events_endpoint` as JSONL until `count` events (0 = unbounded), `timeout_ms`
// without one (0 = wait forever) or a stop signal.
Status admin_watch(const std::string& events_endpoint, uint64_t count, int64_t timeout_ms, std::ostream& out);

}  // namespace mc::store
