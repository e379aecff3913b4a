// The commands of mc-xfer (tools/mc-xfer): serve a verifiable buffer, move one request, benchmark, print
// the topology. The tool's main only parses flags into these option structs and maps the Status to an
// exit code. Data (tables, JSON) goes to `out`; diagnostics to stderr.
//
// The served buffer holds a pattern that depends only on the absolute segment offset, so any client can
// verify any range: byte at offset o = byte (o mod 8) of the little-endian u64 (o div 8 + 1) * 0x9E3779B97F4A7C15.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "mc/common/status.hpp"
#include "mc/transfer/engine.hpp"

namespace mc::transfer::xfer {

// Pattern byte at segment offset `offset` (see above); fill_pattern writes it for [offset, offset+n).
uint8_t pattern_byte(uint64_t offset);
void fill_pattern(char* dst, uint64_t offset, uint64_t n, bool inverted = false);
// Offset of the first byte of [offset, offset+n) at `src` that differs from the pattern; -1 when none.
int64_t find_pattern_mismatch(const char* src, uint64_t offset, uint64_t n, bool inverted = false);

struct ServeOptions {
  EngineOptions engine;  // listen endpoints in engine.listen
  uint64_t size_bytes = 1ull << 30;
  std::string location = "cpu:0";
  std::string stat_listen = "tcp://127.0.0.1:0";  // RPC endpoint answering `stat` (port 0: a free port)
  bool json = false;                              // print the ready information as one JSON line too
  std::string metrics_listen;  // --metrics-listen: "ADDR:PORT" of GET /metrics (metrics_http.hpp); empty: off
};
// Registers a pattern-filled shared buffer, prints the ready line
//   ready mc-xfer <first endpoint> segment=<name> size_bytes=<n> paths=<ep,ep> regions=<n> shm=<yes|no> stat=<ep>
//   [metrics=http://ADDR:PORT]
// and serves until SIGTERM/SIGINT. With engine.grant_key (--auth-dir holding the grant key) every tcp read and write
// must carry a grant. Notifications received are logged at info level. The `stat` endpoint
// answers StatRequest (run_stat) with the engine's served counters (export_served_metrics: tcp reads and
// writes of the segment with their bytes, errors, connections, notifications).
// Errors: kInvalidArgument (size 0, no endpoint, bad location), the engine's and the stat server's bind errors.
Status run_serve(const ServeOptions& options, std::ostream& out);

struct RwOptions {
  EngineOptions engine;
  std::string target;  // segment name "host:port"
  Op op = Op::kRead;
  uint64_t offset = 0;
  uint64_t length = 0;
  bool verify = false;   // read: check the pattern; write: write ~pattern, read back, restore
  bool verbose = false;  // one line per slice
  bool json = false;
  int64_t timeout_ms = 30000;
  std::string notify_tag;
  // The data-plane grant of the target's memory (mc/net/grant.hpp), e.g. a replica's `grant` from
  // `mc-store get-replicas --json`. "": none, or — with an --auth-dir holding the grant key — one issued here.
  std::string grant;
};
Status run_rw(const RwOptions& options, std::ostream& out);

struct BenchOptions {
  EngineOptions engine;
  std::string target;
  Op op = Op::kRead;
  std::vector<uint64_t> block_bytes = {64 << 10, 1 << 20, 4 << 20};
  uint32_t threads = 1;
  uint32_t batch = 32;
  double duration_s = 3.0;
  bool json = false;
  bool baseline = false;  // also measure memcpy (1, 2 threads) and raw TCP to the target's host (1, 4 streams)
  // Before timing, move every byte of the swept range once (untimed), so the figures are steady state: the
  // first touch of each page of a fresh peer mapping (shm) is a page fault — ~13 us per 4 KiB page on a
  // shadow-paging guest — and a short run at small blocks would otherwise measure only that.
  bool warmup = true;
  std::string grant;  // as RwOptions::grant
};
// Prints a header (build, host, transport, paths) and one row per block size: requests, bytes, GB/s
// (decimal), per-path share, request latency p50/p99/p999 in µs; with baseline, the limits and ratios.
Status run_bench(const BenchOptions& options, std::ostream& out);

// Measurements behind --baseline, usable on their own (bytes per second).
double measure_memcpy_bytes_per_second(uint64_t block_bytes, uint32_t threads, uint64_t span_bytes, double duration_s);
// Same, copying from [src, src + span_bytes) (caller's memory, already touched); 0 when span < block.
double measure_memcpy_bytes_per_second(uint64_t block_bytes, uint32_t threads, const char* src, uint64_t span_bytes,
                                       double duration_s);
// Raw TCP over 127.0.0.1: `streams` connections, each sending block_bytes writes to a receiver thread. Each
// stream's receiver cycles through `span` blocks of a buffer of its own, its sender through `sender_span` (1: one
// block-sized buffer, cache-resident as an iperf buffer; more: as much memory touched as the engine's rows touch,
// docs/BENCHMARKS.md "Across hosts").
Result<double> measure_raw_tcp_bytes_per_second(uint64_t block_bytes, uint32_t streams, double duration_s,
                                                uint32_t span = 1, uint32_t sender_span = 1);
// Raw TCP between this host and the transfer engine serving at `endpoint` ("tcp://HOST:PORT"): `streams`
// connections, each a raw stream (the engine's kRawStream op: no headers after the first reply) of block_bytes
// send/recv calls for duration_s, the target sending (target_sends, as for reads) or receiving; each stream cycles
// through `span` blocks of a buffer of its own here and `target_span` there, as above (block x span above 256 MiB is
// kInvalidArgument here, and refused by the target). Both ends' sockets get socket_buffer_bytes, as the engine's
// data connections. `grant`: a grant token when the target enforces them. Errors: the connect's, or the target's
// refusal (an older target answers kMalformedMessage "unknown op 7").
Result<double> measure_remote_raw_tcp_bytes_per_second(const std::string& endpoint, const std::string& grant,
                                                       bool target_sends, uint64_t block_bytes, uint32_t streams,
                                                       double duration_s, int socket_buffer_bytes, uint32_t span = 1,
                                                       uint32_t target_span = 1);

// `mc-xfer stat`: the counters of the `mc-xfer serve` whose stat endpoint is `endpoint` (daemon::print_stat).
struct StatOptions {
  std::string endpoint;  // tcp://HOST:PORT, the stat= field of the serve's ready line
  int timeout_ms = 2000;
  bool json = false;
};
Status run_stat(const StatOptions& options, std::ostream& out);

struct TopoOptions {
  std::string topology_file;  // "" = discover from sysfs
  bool json = false;
};
Status run_topo(const TopoOptions& options, std::ostream& out);

}  // namespace mc::transfer::xfer
