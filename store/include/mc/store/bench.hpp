// `mc-store bench`: throughput of the store as its users see it.
//  metadata: operations per second of put (put_start + put_end of a 4 KiB object: two requests, the
//            put_end sent write-behind with the next put_start as WriteOptions::wait_commit = false does;
//            a put counts when its put_end reply arrives), put_sync (the same, each reply waited for:
//            two round trips; with --transport zmq, put is put_sync), get
//            (get_replicas) and match (match_prefix over 24 keys), with N concurrent clients (connections),
//            each with `pipeline` requests in flight; the figure to compare with
//            `redis-benchmark -t set,get -c N -P pipeline` (tests/bench/store_bench.sh). transport "fast": one
//            thread drives every connection over the master's fast path, as redis-benchmark drives its
//            connections from one event loop; "zmq": one thread and RpcClient per connection.
//  data:     batch_put / batch_get GB/s (decimal) of blocks of block_tokens x kv_bytes_per_token bytes
//            through the client library (blocks registered with the client's transfer engine once, as a
//            worker registers its KV cache), to compare with `mc-xfer bench` on the same path; puts commit
//            write-behind (WriteOptions::wait_commit = false) with a timed flush() per round. Puts run
//            for duration_s over fresh keys (each round removed right after), then gets for duration_s
//            over one round of stored blocks, so both stream without waiting for leases. Refused
//            (kInvalidArgument) when the mounted DRAM cannot hold three rounds below 80 % (the default low
//            watermark): blocks would be evicted under the benchmark.
// Every loop is bounded by duration_s and by max_ops. Output: a table (units in headers) or JSON.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "mc/common/status.hpp"
#include "mc/store/client.hpp"

namespace mc::store {

struct BenchOptions {
  ClientOptions client;
  std::string mode = "metadata";  // metadata | data
  std::vector<int64_t> clients = {1, 8, 32};
  std::vector<std::string> ops = {"put", "put_sync", "get", "match"};
  std::string transport = "fast";      // metadata: fast (plain TCP, one thread driving every connection,
                                       // as redis-benchmark does) or zmq (RpcClient, one thread each)
  uint32_t pipeline = 1;               // metadata, fast: requests in flight per connection (redis -P)
  double duration_s = 2.0;             // per (op, clients) point
  uint64_t max_ops = 2'000'000;        // per point, all clients together
  uint64_t kv_bytes_per_token = 2048;  // data mode
  uint64_t block_tokens = 512;
  uint64_t blocks = 64;  // data mode: blocks per round
  uint64_t batch = 16;   // data mode: blocks per batch call
  bool json = false;
};

Status run_bench(const BenchOptions& options, std::ostream& out);

}  // namespace mc::store
