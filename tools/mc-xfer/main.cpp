// mc-xfer: the transfer engine's tool. Subcommands: serve, stat, bench, read, write, topo (man/mc-xfer.1).
#include <iostream>

#include "mc/cli/cli.hpp"
#include "mc/common/daemon.hpp"
#include "mc/common/units.hpp"
#include "mc/net/auth.hpp"
#include "mc/net/flags.hpp"
#include "mc/transfer/xfer_tool.hpp"

namespace {

using mc::transfer::EngineOptions;

// SO_SNDBUF/SO_RCVBUF: 0 (kernel autotuning) to 1GiB.
constexpr uint64_t kMaxSocketBufferBytes = 1ull << 30;

// Engine flags shared by the client subcommands.
struct EngineFlags {
  std::string transport = "auto";
  std::vector<std::string> local;
  uint64_t slice_bytes = 64 << 10;
  uint32_t connections = EngineOptions{}.connections_per_path;
  uint32_t io_threads = EngineOptions{}.tcp_io_threads;
  uint64_t socket_buffer_bytes = static_cast<uint64_t>(EngineOptions{}.socket_buffer_bytes);
  int64_t timeout_ms = 30000;
  std::string topology;

  void add(CLI::App* cmd) {
    cmd->add_option("--transport", transport, "Transport: auto (shm on the same host, else tcp), tcp, shm or rdma")
        ->envname("MC_XFER_TRANSPORT")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "tcp", "shm", "rdma"}));
    cmd->add_option("--local", local, "Local source address of outgoing tcp paths (repeat for several NICs)")
        ->envname("MC_XFER_LOCAL");
    mc::cli::add_size_option(*cmd, "--slice", slice_bytes, "Slice size (e.g. 16KiB, 64KiB, 256KiB)", 1)
        ->envname("MC_XFER_SLICE");
    cmd->add_option("--connections", connections, "TCP connections per path")
        ->capture_default_str()
        ->check(CLI::Range(1u, 64u));
    cmd->add_option("--io-threads", io_threads,
                    "tcp I/O threads per segment, each owning a share of the connections (0: one per connection)")
        ->envname("MC_XFER_IO_THREADS")
        ->capture_default_str()
        ->check(CLI::Range(0u, 64u));
    mc::cli::add_size_option(*cmd, "--socket-buffer", socket_buffer_bytes,
                             "SO_SNDBUF/SO_RCVBUF of tcp data connections in bytes (0: kernel autotuning)", 0,
                             kMaxSocketBufferBytes)
        ->envname("MC_XFER_SOCKET_BUFFER");
    cmd->add_option("--timeout-ms", timeout_ms, "Deadline of one request in milliseconds")
        ->envname("MC_XFER_TIMEOUT_MS")
        ->capture_default_str()
        ->check(CLI::Range(int64_t{1}, int64_t{86400000}));
    cmd->add_option("--topology", topology, "Topology matrix JSON file (default: discover from sysfs)")
        ->envname("MC_XFER_TOPOLOGY");
    cmd->add_option("--grant", grant,
                    "Data-plane grant token for the target's memory (a replica's grant from the store master; "
                    "default: none, or one issued here when --auth-dir holds the cluster's grant key)")
        ->envname("MC_XFER_GRANT");
    mc::cli::add_auth_flags(*cmd, "admin");
  }
  std::string grant;

  EngineOptions to_options() const {
    EngineOptions o;
    if (transport != "auto") o.transports = {transport};
    o.local_addresses = local;
    o.slicing.slice_bytes = slice_bytes;
    o.slicing.min_tail_bytes = std::min<uint64_t>(o.slicing.min_tail_bytes, o.slicing.slice_bytes);
    o.connections_per_path = connections;
    o.tcp_io_threads = io_threads;
    o.socket_buffer_bytes = static_cast<int>(socket_buffer_bytes);
    o.request_timeout_ms = timeout_ms;
    o.topology_file = topology;
    return o;
  }
};

int run(const std::string& name, const mc::Status& st) { return mc::cli::report(name, st); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mc-xfer: serve, benchmark and debug the mc transfer engine (tcp, shm, rdma)"};
  app.require_subcommand(1);
  mc::cli::add_common_flags(app, "mc-xfer");

  // serve
  mc::transfer::xfer::ServeOptions serve;
  uint64_t serve_socket_buffer_bytes = static_cast<uint64_t>(EngineOptions{}.socket_buffer_bytes);
  std::vector<std::string> serve_listen = {"tcp://127.0.0.1:0"};
  auto* serve_cmd = app.add_subcommand("serve", "Register a pattern-filled buffer and serve it until SIGTERM");
  mc::cli::add_size_option(*serve_cmd, "--size", serve.size_bytes, "Bytes to serve (e.g. 1GiB)", 1)
      ->envname("MC_XFER_SIZE");
  serve_cmd->add_option("--listen", serve_listen, "Endpoint to serve on, tcp://ADDR:PORT (repeat: one path each)")
      ->envname("MC_XFER_LISTEN")
      ->capture_default_str();
  mc::cli::add_location_option(*serve_cmd, serve.location,
                               "Memory location of the buffer: cpu:N, or cuda:N in a CUDA build");
  mc::cli::add_size_option(*serve_cmd, "--max-region", serve.engine.max_region_bytes,
                           "Split the registration into regions of at most this size (0: whole)");
  mc::cli::add_size_option(*serve_cmd, "--socket-buffer", serve_socket_buffer_bytes,
                           "SO_SNDBUF/SO_RCVBUF of accepted tcp connections in bytes (0: kernel autotuning)", 0,
                           kMaxSocketBufferBytes)
      ->envname("MC_XFER_SOCKET_BUFFER");
  serve_cmd
      ->add_option("--stat-listen", serve.stat_listen,
                   "RPC endpoint answering mc-xfer stat, tcp://ADDR:PORT (port 0: a free port; in the ready line)")
      ->envname("MC_XFER_STAT_LISTEN")
      ->capture_default_str();
  mc::cli::add_json_flag(*serve_cmd, serve.json, "Also print the segment as one JSON line");
  mc::cli::add_metrics_flags(*serve_cmd, serve.metrics_listen);
  mc::cli::add_auth_flags(*serve_cmd, "node");
  mc::cli::add_xfer_server_flags(*serve_cmd, serve.engine.max_connections_served, serve.engine.idle_timeout_served_ms);

  // stat
  mc::transfer::xfer::StatOptions stat;
  auto* stat_cmd =
      app.add_subcommand("stat", "Print the counters of a running mc-xfer serve (bytes, transfers, errors)");
  stat_cmd->add_option("--endpoint", stat.endpoint, "Its stat endpoint, tcp://HOST:PORT (stat= in its ready line)")
      ->envname("MC_XFER_STAT")
      ->required();
  stat_cmd->add_option("--timeout-ms", stat.timeout_ms, "Reply deadline (ms)")
      ->capture_default_str()
      ->check(CLI::Range(1, 600000));
  mc::cli::add_json_flag(*stat_cmd, stat.json, "Print the counters as one JSON document");

  // bench
  mc::transfer::xfer::BenchOptions bench;
  EngineFlags bench_engine;
  std::string bench_op = "read", bench_blocks = "64KiB,1MiB,4MiB";
  auto* bench_cmd = app.add_subcommand("bench", "Measure throughput and latency against a served segment");
  bench_cmd->add_option("--target", bench.target, "Segment to use, HOST:PORT (printed by mc-xfer serve)")
      ->envname("MC_XFER_TARGET")
      ->required();
  bench_cmd->add_option("--op", bench_op, "read or write")
      ->capture_default_str()
      ->check(CLI::IsMember({"read", "write"}));
  bench_cmd->add_option("--block", bench_blocks, "Request sizes, comma-separated")->capture_default_str();
  bench_cmd->add_option("--threads", bench.threads, "Submitting threads")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  bench_cmd->add_option("--batch", bench.batch, "Requests per batch")
      ->capture_default_str()
      ->check(CLI::Range(1u, 4096u));
  bench_cmd->add_option("--duration", bench.duration_s, "Seconds per block size")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 3600.0));
  bench_cmd->add_flag(
      "--baseline", bench.baseline,
      "Also measure memcpy (1, 2 threads) and raw TCP to the target's host (1, 4 streams; 4 streams through the "
      "row's memory) and print ratios");
  bool no_warmup = false;
  bench_cmd->add_flag("--no-warmup", no_warmup,
                      "Skip the untimed pass that reads the swept range once before timing (first-touch page faults "
                      "then count)");
  mc::cli::add_json_flag(*bench_cmd, bench.json, "One JSON document instead of the table");
  bench_engine.add(bench_cmd);

  // read / write
  mc::transfer::xfer::RwOptions rw;
  EngineFlags rw_engine;
  rw.length = 1 << 20;
  auto add_rw = [&](const char* name, const char* help) {
    auto* cmd = app.add_subcommand(name, help);
    cmd->add_option("--target", rw.target, "Segment, HOST:PORT")->envname("MC_XFER_TARGET")->required();
    mc::cli::add_size_option(*cmd, "--offset", rw.offset, "Segment offset in bytes (size suffixes allowed)");
    mc::cli::add_size_option(*cmd, "--length", rw.length, "Bytes to move");
    cmd->add_flag("--verify", rw.verify, "Check the served pattern (write: write, read back, restore)");
    cmd->add_flag("-v,--verbose", rw.verbose, "Print each slice: path, offset, bytes, attempts, time");
    cmd->add_option("--notify", rw.notify_tag, "Notification tag delivered to the target after the bytes");
    mc::cli::add_json_flag(*cmd, rw.json, "One JSON document instead of text");
    rw_engine.add(cmd);
    return cmd;
  };
  auto* read_cmd = add_rw("read", "Read one range of a segment");
  auto* write_cmd = add_rw("write", "Write one range of a segment (with the pattern)");

  // topo
  mc::transfer::xfer::TopoOptions topo;
  auto* topo_cmd = app.add_subcommand("topo", "Print this host's topology matrix");
  topo_cmd->add_option("--topology", topo.topology_file, "Read this JSON file instead of sysfs")
      ->envname("MC_XFER_TOPOLOGY");
  mc::cli::add_json_flag(*topo_cmd, topo.json, "JSON (the --topology file format)");

  mc::cli::add_auth_flags(*stat_cmd, "admin");

  if (int rc = mc::cli::parse(app, argc, argv); rc >= 0) return rc;

  if (serve_cmd->parsed()) {
    serve.engine.listen = serve_listen;
    serve.engine.socket_buffer_bytes = static_cast<int>(serve_socket_buffer_bytes);
    if (const mc::auth::Keyring* ring = mc::auth::keyring(); ring != nullptr)
      serve.engine.grant_key = ring->grant_key();
    mc::daemon::install_stop_signals();
    return run("mc-xfer serve", mc::transfer::xfer::run_serve(serve, std::cout));
  }
  if (bench_cmd->parsed()) {
    auto blocks = mc::units::parse_size_list(bench_blocks);
    if (!blocks.is_ok()) return run("mc-xfer bench", blocks.status());
    bench.engine = bench_engine.to_options();
    bench.block_bytes.assign(blocks->begin(), blocks->end());
    bench.op = bench_op == "write" ? mc::transfer::Op::kWrite : mc::transfer::Op::kRead;
    bench.warmup = !no_warmup;
    bench.grant = bench_engine.grant;
    return run("mc-xfer bench", mc::transfer::xfer::run_bench(bench, std::cout));
  }
  if (read_cmd->parsed() || write_cmd->parsed()) {
    const std::string name = read_cmd->parsed() ? "mc-xfer read" : "mc-xfer write";
    rw.engine = rw_engine.to_options();
    rw.timeout_ms = rw.engine.request_timeout_ms;
    rw.grant = rw_engine.grant;
    rw.op = read_cmd->parsed() ? mc::transfer::Op::kRead : mc::transfer::Op::kWrite;
    return run(name, mc::transfer::xfer::run_rw(rw, std::cout));
  }
  if (stat_cmd->parsed())
    return mc::cli::report("mc-xfer stat", mc::transfer::xfer::run_stat(stat, std::cout), stat.json);
  if (topo_cmd->parsed()) return run("mc-xfer topo", mc::transfer::xfer::run_topo(topo, std::cout));
  return mc::cli::kExitUsage;
}
