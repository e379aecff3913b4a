// mc-xfer: the transfer engine's tool. Subcommands: serve, bench, read, write, topo (man/mc-xfer.1).
#include <iostream>

#include "mc/common/cli.hpp"
#include "mc/common/daemon.hpp"
#include "mc/common/units.hpp"
#include "mc/transfer/xfer_tool.hpp"

namespace {

using mc::transfer::EngineOptions;

mc::Result<int> parse_socket_buffer(const std::string& text) {
  MC_ASSIGN_OR_RETURN(int64_t b, mc::units::parse_size_bytes(text));
  if (b < 0 || b > (1ll << 30)) {
    return mc::Status(mc::Code::kInvalidArgument, "--socket-buffer " + text + ": want 0 (autotuning) to 1GiB");
  }
  return static_cast<int>(b);
}

// Engine flags shared by the client subcommands; sizes are kept as text and parsed after CLI11.
struct EngineFlags {
  std::string transport = "auto";
  std::vector<std::string> local;
  std::string slice = "64KiB";
  uint32_t connections = EngineOptions{}.connections_per_path;
  uint32_t io_threads = EngineOptions{}.tcp_io_threads;
  std::string socket_buffer = std::to_string(EngineOptions{}.socket_buffer_bytes);
  int64_t timeout_ms = 30000;
  std::string topology;

  void add(CLI::App* cmd) {
    cmd->add_option("--transport", transport, "Transport: auto (shm on the same host, else tcp), tcp, shm or rdma")
        ->envname("MC_XFER_TRANSPORT")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "tcp", "shm", "rdma"}));
    cmd->add_option("--local", local, "Local source address of outgoing tcp paths (repeat for several NICs)")
        ->envname("MC_XFER_LOCAL");
    cmd->add_option("--slice", slice, "Slice size (e.g. 16KiB, 64KiB, 256KiB)")
        ->envname("MC_XFER_SLICE")
        ->capture_default_str();
    cmd->add_option("--connections", connections, "TCP connections per path")
        ->capture_default_str()
        ->check(CLI::Range(1u, 64u));
    cmd->add_option("--io-threads", io_threads,
                    "tcp I/O threads per segment, each owning a share of the connections (0: one per connection)")
        ->envname("MC_XFER_IO_THREADS")
        ->capture_default_str()
        ->check(CLI::Range(0u, 64u));
    cmd->add_option("--socket-buffer", socket_buffer,
                    "SO_SNDBUF/SO_RCVBUF of tcp data connections in bytes (0: kernel autotuning)")
        ->envname("MC_XFER_SOCKET_BUFFER")
        ->capture_default_str();
    cmd->add_option("--timeout-ms", timeout_ms, "Deadline of one request in milliseconds")
        ->envname("MC_XFER_TIMEOUT_MS")
        ->capture_default_str()
        ->check(CLI::Range(int64_t{1}, int64_t{86400000}));
    cmd->add_option("--topology", topology, "Topology matrix JSON file (default: discover from sysfs)")
        ->envname("MC_XFER_TOPOLOGY");
  }

  mc::Result<EngineOptions> to_options() const {
    EngineOptions o;
    if (transport != "auto") o.transports = {transport};
    o.local_addresses = local;
    MC_ASSIGN_OR_RETURN(int64_t s, mc::units::parse_size_bytes(slice));
    if (s <= 0) return mc::Status(mc::Code::kInvalidArgument, "--slice must be > 0");
    o.slicing.slice_bytes = static_cast<uint64_t>(s);
    o.slicing.min_tail_bytes = std::min<uint64_t>(o.slicing.min_tail_bytes, o.slicing.slice_bytes);
    o.connections_per_path = connections;
    o.tcp_io_threads = io_threads;
    MC_ASSIGN_OR_RETURN(o.socket_buffer_bytes, parse_socket_buffer(socket_buffer));
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
  std::string serve_size = "1GiB", serve_max_region = "0";
  std::string serve_socket_buffer = std::to_string(EngineOptions{}.socket_buffer_bytes);
  std::vector<std::string> serve_listen = {"tcp://127.0.0.1:0"};
  auto* serve_cmd = app.add_subcommand("serve", "Register a pattern-filled buffer and serve it until SIGTERM");
  serve_cmd->add_option("--size", serve_size, "Bytes to serve (e.g. 1GiB)")
      ->envname("MC_XFER_SIZE")
      ->capture_default_str();
  serve_cmd->add_option("--listen", serve_listen, "Endpoint to serve on, tcp://ADDR:PORT (repeat: one path each)")
      ->envname("MC_XFER_LISTEN")
      ->capture_default_str();
  serve_cmd->add_option("--location", serve.location, "Memory location of the buffer (cpu:N)")->capture_default_str();
  serve_cmd
      ->add_option("--max-region", serve_max_region,
                   "Split the registration into regions of at most this size (0: whole)")
      ->capture_default_str();
  serve_cmd
      ->add_option("--socket-buffer", serve_socket_buffer,
                   "SO_SNDBUF/SO_RCVBUF of accepted tcp connections in bytes (0: kernel autotuning)")
      ->envname("MC_XFER_SOCKET_BUFFER")
      ->capture_default_str();
  serve_cmd->add_flag("--json", serve.json, "Also print the segment as one JSON line");

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
  bench_cmd->add_flag("--baseline", bench.baseline,
                      "Also measure memcpy (1, 2 threads) and raw loopback TCP (1, 4 streams) and print ratios");
  bool no_warmup = false;
  bench_cmd->add_flag("--no-warmup", no_warmup,
                      "Skip the untimed pass that reads the swept range once before timing (first-touch page faults "
                      "then count)");
  bench_cmd->add_flag("--json", bench.json, "One JSON document instead of the table");
  bench_engine.add(bench_cmd);

  // read / write
  mc::transfer::xfer::RwOptions rw;
  EngineFlags rw_engine;
  std::string rw_offset = "0", rw_length = "1MiB";
  auto add_rw = [&](const char* name, const char* help) {
    auto* cmd = app.add_subcommand(name, help);
    cmd->add_option("--target", rw.target, "Segment, HOST:PORT")->envname("MC_XFER_TARGET")->required();
    cmd->add_option("--offset", rw_offset, "Segment offset in bytes (size suffixes allowed)")->capture_default_str();
    cmd->add_option("--length", rw_length, "Bytes to move")->capture_default_str();
    cmd->add_flag("--verify", rw.verify, "Check the served pattern (write: write, read back, restore)");
    cmd->add_flag("-v,--verbose", rw.verbose, "Print each slice: path, offset, bytes, attempts, time");
    cmd->add_option("--notify", rw.notify_tag, "Notification tag delivered to the target after the bytes");
    cmd->add_flag("--json", rw.json, "One JSON document instead of text");
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
  topo_cmd->add_flag("--json", topo.json, "JSON (the --topology file format)");

  if (int rc = mc::cli::parse(app, argc, argv); rc >= 0) return rc;

  if (serve_cmd->parsed()) {
    auto size = mc::units::parse_size_bytes(serve_size);
    if (!size.is_ok() || size.value() <= 0)
      return run("mc-xfer serve",
                 mc::Status(mc::Code::kInvalidArgument,
                            "--size: " + (size.is_ok() ? std::string("must be > 0") : size.status().message())));
    auto max_region = mc::units::parse_size_bytes(serve_max_region);
    if (!max_region.is_ok()) return run("mc-xfer serve", max_region.status());
    serve.size_bytes = static_cast<uint64_t>(size.value());
    serve.engine.listen = serve_listen;
    serve.engine.max_region_bytes = static_cast<uint64_t>(max_region.value());
    auto socket_buffer = parse_socket_buffer(serve_socket_buffer);
    if (!socket_buffer.is_ok()) return run("mc-xfer serve", socket_buffer.status());
    serve.engine.socket_buffer_bytes = socket_buffer.value();
    mc::daemon::install_stop_signals();
    return run("mc-xfer serve", mc::transfer::xfer::run_serve(serve, std::cout));
  }
  if (bench_cmd->parsed()) {
    auto eo = bench_engine.to_options();
    if (!eo.is_ok()) return run("mc-xfer bench", eo.status());
    auto blocks = mc::units::parse_size_list(bench_blocks);
    if (!blocks.is_ok()) return run("mc-xfer bench", blocks.status());
    bench.engine = eo.value();
    bench.block_bytes.assign(blocks->begin(), blocks->end());
    bench.op = bench_op == "write" ? mc::transfer::Op::kWrite : mc::transfer::Op::kRead;
    bench.warmup = !no_warmup;
    return run("mc-xfer bench", mc::transfer::xfer::run_bench(bench, std::cout));
  }
  if (read_cmd->parsed() || write_cmd->parsed()) {
    const std::string name = read_cmd->parsed() ? "mc-xfer read" : "mc-xfer write";
    auto eo = rw_engine.to_options();
    if (!eo.is_ok()) return run(name, eo.status());
    auto off = mc::units::parse_size_bytes(rw_offset);
    auto len = mc::units::parse_size_bytes(rw_length);
    if (!off.is_ok()) return run(name, off.status().with_context("--offset"));
    if (!len.is_ok()) return run(name, len.status().with_context("--length"));
    if (off.value() < 0 || len.value() < 0)
      return run(name, mc::Status(mc::Code::kInvalidArgument, "--offset/--length must be >= 0"));
    rw.engine = eo.value();
    rw.timeout_ms = rw.engine.request_timeout_ms;
    rw.op = read_cmd->parsed() ? mc::transfer::Op::kRead : mc::transfer::Op::kWrite;
    rw.offset = static_cast<uint64_t>(off.value());
    rw.length = static_cast<uint64_t>(len.value());
    return run(name, mc::transfer::xfer::run_rw(rw, std::cout));
  }
  if (topo_cmd->parsed()) return run("mc-xfer topo", mc::transfer::xfer::run_topo(topo, std::cout));
  return mc::cli::kExitUsage;
}
