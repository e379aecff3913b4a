#include "mc/store/bench.hpp"

#include <poll.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <iomanip>
#include <thread>

#include <nlohmann/json.hpp>

#include "mc/cli/cli.hpp"
#include "mc/common/report.hpp"
#include "mc/coord/leader.hpp"
#include "mc/net/rpc.hpp"
#include "mc/store/master_core.hpp"

#include "mc/net/fast_rpc.hpp"
#include "mc/proto/store.hpp"

namespace mc::store {

namespace {

using SteadyClock = std::chrono::steady_clock;

struct Point {
  std::string op;
  int64_t clients = 0;
  uint64_t ops = 0, errors = 0;
  double seconds = 0;
  double rate() const { return seconds > 0 ? static_cast<double>(ops) / seconds : 0; }
};

// The keys read by get and match: 24 blocks of one chain, stored (pinned) once.
Result<std::vector<std::string>> stored_chain(const BenchOptions& o, const std::string& run_id) {
  std::vector<std::string> chain;
  for (int i = 0; i < 24; ++i) chain.push_back("bench/" + run_id + "/chain/" + std::to_string(i));
  MC_ASSIGN_OR_RETURN(auto cl, Client::connect(o.client));
  std::vector<std::byte> blob(4096, std::byte{1});
  for (const auto& k : chain) {
    Status s = cl->put(k, blob, {false, true});
    if (!s.is_ok() && s.code() != Code::kAlreadyExists) return s;
  }
  return chain;
}

bool is_put(const std::string& op) { return op == "put" || op == "put_sync"; }

// One metadata request of `op` for connection `conn`: (type, msgpack body). A put is two requests:
// put_start (stage 0) then put_end (stage 1) with the granted put_id.
struct Request {
  const char* type;
  std::string body;
};
Request make_request(const std::string& op, const std::string& cid, const std::string& key_prefix, uint64_t n,
                     const std::vector<std::string>& chain) {
  if (is_put(op)) {
    proto::StorePutStartRequest ps;
    ps.client_id = cid;
    ps.keys = {key_prefix + std::to_string(n)};
    ps.sizes_bytes = {4096};
    return {proto::StorePutStartRequest::kType, codec::pack(ps)};
  }
  if (op == "get") {
    proto::StoreGetReplicasRequest g;
    g.client_id = cid;
    g.keys = {chain[n % chain.size()]};
    return {proto::StoreGetReplicasRequest::kType, codec::pack(g)};
  }
  return {proto::StoreMatchPrefixRequest::kType, codec::pack(proto::StoreMatchPrefixRequest{chain})};
}

// Fast path, driven like redis-benchmark: one thread, `clients` connections, each with `pipeline`
// requests in flight; a reply is checked and answered by the connection's next request at once.
// put_sync: put_start, its reply, put_end, its reply, then the next put_start (two round trips per put).
// put (write-behind, as Client with WriteOptions::wait_commit = false): on put_start's reply the put_end
// and the next put_start leave together in one send; a put counts when its put_end reply arrives.
Result<Point> fast_point(const BenchOptions& o, const std::string& op, int64_t clients, const std::string& run_id,
                         const std::vector<std::string>& chain) {
  MC_ASSIGN_OR_RETURN(Endpoint fast_ep, parse_endpoint(o.client.master));
  {
    rpc::ClientOptions co;
    co.client_name = "bench-" + run_id;
    MC_ASSIGN_OR_RETURN(auto z, rpc::RpcClient::connect(o.client.master, co));
    MC_ASSIGN_OR_RETURN(auto info, z->call(proto::StoreInfoRequest{co.client_name}, o.client.rpc_timeout_ms));
    if (info.fast_port == 0) {
      return Status(Code::kUnimplemented, "master " + o.client.master +
                                              " offers no fast path (started with --fast-listen off?); "
                                              "use --transport zmq");
    }
    fast_ep.port = static_cast<uint16_t>(info.fast_port);
  }
  struct InFlight {
    uint64_t id;
    int stage;  // put: 0 put_start, 1 put_end
    uint64_t n;
  };
  struct Conn {
    std::unique_ptr<rpc::fast::FastClient> c;
    std::string cid, key_prefix;
    std::deque<InFlight> flight;
    uint64_t next_n = 0;
  };
  std::vector<Conn> conns(static_cast<size_t>(clients));
  for (int64_t i = 0; i < clients; ++i) {
    Conn& k = conns[static_cast<size_t>(i)];
    k.cid = "bench-" + run_id + "-" + std::to_string(i);
    k.key_prefix = "bench/" + run_id + "/" + std::to_string(i) + "/";
    MC_ASSIGN_OR_RETURN(k.c, rpc::fast::FastClient::connect(fast_ep, k.cid, o.client.rpc_timeout_ms));
  }
  uint64_t started = 0, done = 0, errors = 0;
  auto issue = [&](Conn& k) -> Status {
    if (started >= o.max_ops) return k.c->write_queued();
    Request r = make_request(op, k.cid, k.key_prefix, k.next_n, chain);
    MC_ASSIGN_OR_RETURN(uint64_t id, k.c->send(r.type, r.body));
    k.flight.push_back({id, 0, k.next_n++});
    ++started;
    return Status::ok();
  };
  const auto t0 = SteadyClock::now();
  const auto deadline = t0 + std::chrono::duration<double>(o.duration_s);
  for (auto& k : conns) {
    for (uint32_t p = 0; p < o.pipeline; ++p) MC_RETURN_IF_ERROR(issue(k));
  }
  std::vector<pollfd> fds(conns.size());
  bool stopping = false;
  while (true) {
    if (!stopping && SteadyClock::now() >= deadline) stopping = true;
    size_t in_flight = 0;
    for (size_t i = 0; i < conns.size(); ++i) {
      in_flight += conns[i].flight.size();
      fds[i] = {conns[i].c->fd(), static_cast<short>(POLLIN | (conns[i].c->wants_write() ? POLLOUT : 0)), 0};
    }
    if (in_flight == 0) break;
    if (SteadyClock::now() > deadline + std::chrono::milliseconds(o.client.rpc_timeout_ms)) {
      return Status(Code::kTimeout, std::to_string(in_flight) +
                                        " requests to the master's fast path unanswered after " +
                                        std::to_string(o.client.rpc_timeout_ms) + " ms");
    }
    if (::poll(fds.data(), fds.size(), 100) < 0 && errno != EINTR)
      return Status(Code::kIo, "poll: " + std::string(strerror(errno)));
    for (size_t i = 0; i < conns.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Conn& k = conns[i];
      while (true) {
        MC_ASSIGN_OR_RETURN(std::optional<rpc::fast::FastClient::Reply> r, k.c->try_recv());
        if (!r) break;
        if (k.flight.empty() || k.flight.front().id != r->id) {
          return Status(Code::kMalformedMessage,
                        "reply " + std::to_string(r->id) + " from " + k.c->endpoint() + " out of order");
        }
        InFlight f = k.flight.front();
        k.flight.pop_front();
        bool ok = r->status.is_ok();
        if (ok && is_put(op) && f.stage == 0) {
          auto g = codec::unpack<proto::StorePutStartReply>(r->body, "put_start reply");
          if (g.is_ok() && g->items.size() == 1 && g->items[0].code == 0) {
            // Metadata only: no bytes are written, so the checksum (of nothing) is never checked by a read.
            proto::StorePutEndRequest e{k.cid, {k.key_prefix + std::to_string(f.n)}, {g->items[0].put_id}, {0}};
            const bool behind = op == "put";
            MC_ASSIGN_OR_RETURN(uint64_t id, k.c->send(proto::StorePutEndRequest::kType, codec::pack(e), !behind));
            k.flight.push_back({id, 1, f.n});
            if (behind) {
              if (stopping) {
                MC_RETURN_IF_ERROR(k.c->write_queued());
              } else {
                MC_RETURN_IF_ERROR(issue(k));
              }
            }
            continue;
          }
          ok = false;
        } else if (ok && is_put(op)) {
          auto e = codec::unpack<proto::StoreItemsReply>(r->body, "put_end reply");
          ok = e.is_ok() && e->codes.size() == 1 && e->codes[0] == 0;
        } else if (ok && op == "get") {
          auto g = codec::unpack<proto::StoreGetReplicasReply>(r->body, "get_replicas reply");
          ok = g.is_ok() && g->items.size() == 1 && g->items[0].code == 0;
        } else if (ok) {
          auto m = codec::unpack<proto::StoreMatchPrefixReply>(r->body, "match_prefix reply");
          ok = m.is_ok() && m->matched_blocks == chain.size();
        }
        ++done;
        if (!ok) ++errors;
        // A write-behind put's next put_start already left with its put_end (unless put_start failed).
        const bool issued = op == "put" && f.stage == 1;
        if (!stopping && !issued) MC_RETURN_IF_ERROR(issue(k));
      }
    }
  }
  Point p;
  p.op = op;
  p.clients = clients;
  p.ops = done;
  p.errors = errors;
  p.seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  return p;
}

// ZeroMQ path (the RpcClient every other service uses): `clients` threads, one connection and one
// request in flight each.
Result<Point> zmq_point(const BenchOptions& o, const std::string& op, int64_t clients, const std::string& run_id,
                        const std::vector<std::string>& chain) {
  std::vector<std::unique_ptr<rpc::RpcClient>> conns;
  for (int64_t i = 0; i < clients; ++i) {
    rpc::ClientOptions co;
    co.client_name = "bench-" + run_id + "-" + std::to_string(i);
    MC_ASSIGN_OR_RETURN(auto c, rpc::RpcClient::connect(o.client.master, co));
    conns.push_back(std::move(c));
  }
  std::atomic<uint64_t> total{0}, errors{0};
  std::atomic<bool> go{false};
  auto deadline_ns = static_cast<int64_t>(o.duration_s * 1e9);
  std::vector<std::thread> threads;
  for (int64_t i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      while (!go.load()) std::this_thread::yield();
      rpc::RpcClient& c = *conns[i];
      std::string cid = "bench-" + run_id + "-" + std::to_string(i);
      std::string prefix = "bench/" + run_id + "/" + std::to_string(i) + "/";
      uint64_t n = 0;
      auto start = SteadyClock::now();
      while (total.load(std::memory_order_relaxed) < o.max_ops) {
        if ((n & 15) == 0 && (SteadyClock::now() - start).count() > deadline_ns) break;
        bool ok = true;
        if (is_put(op)) {
          proto::StorePutStartRequest ps;
          ps.client_id = cid;
          ps.keys = {prefix + std::to_string(n)};
          ps.sizes_bytes = {4096};
          auto g = c.call(ps);
          ok = g.is_ok() && g->items[0].code == 0;
          if (ok) {
            auto e = c.call(proto::StorePutEndRequest{cid, ps.keys, {g->items[0].put_id}, {0}});  // metadata only
            ok = e.is_ok() && e->codes[0] == 0;
          }
        } else if (op == "get") {
          proto::StoreGetReplicasRequest g;
          g.client_id = cid;
          g.keys = {chain[n % chain.size()]};
          auto r = c.call(g);
          ok = r.is_ok() && r->items[0].code == 0;
        } else {
          auto r = c.call(proto::StoreMatchPrefixRequest{chain});
          ok = r.is_ok() && r->matched_blocks == chain.size();
        }
        ++n;
        total.fetch_add(1, std::memory_order_relaxed);
        if (!ok) errors.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  auto t0 = SteadyClock::now();
  go.store(true);
  for (auto& t : threads) t.join();
  Point p;
  p.op = op;
  p.clients = clients;
  p.ops = total.load();
  p.errors = errors.load();
  p.seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  return p;
}

Result<Point> metadata_point(const BenchOptions& o, const std::string& op, int64_t clients, const std::string& run_id) {
  std::vector<std::string> chain;
  if (!is_put(op)) {
    MC_ASSIGN_OR_RETURN(chain, stored_chain(o, run_id));
  }
  if (o.transport == "fast") return fast_point(o, op, clients, run_id, chain);
  return zmq_point(o, op, clients, run_id, chain);
}

Status data_bench(const BenchOptions& o, std::ostream& out) {
  uint64_t block_bytes = o.kv_bytes_per_token * o.block_tokens;
  MC_ASSIGN_OR_RETURN(auto cl, Client::connect(o.client));
  // Up to three rounds of blocks live at once (the warm-up's, while its leases run; the read set; a put
  // round). If the mounted DRAM cannot hold them below the eviction watermark, blocks would be evicted
  // under the benchmark: refuse up front rather than measure misses.
  {
    MC_ASSIGN_OR_RETURN(auto st, cl->stat());
    uint64_t dram_bytes = 0;
    for (const auto& seg : st.segments) {
      if (seg.medium == "cpu") dram_bytes += seg.capacity_bytes;
    }
    const uint64_t working_set_bytes = 3 * o.blocks * block_bytes;
    const double kUsable = MasterConfig{}.low_watermark;  // eviction brings a segment down to this
    if (static_cast<double>(working_set_bytes) > kUsable * static_cast<double>(dram_bytes)) {
      return Status(Code::kInvalidArgument,
                    "the data benchmark keeps up to " + std::to_string(working_set_bytes) +
                        " bytes stored (3 rounds of " + std::to_string(o.blocks) + " blocks of " +
                        std::to_string(block_bytes) + " bytes) but the nodes of " + o.client.master + " mount " +
                        std::to_string(dram_bytes) +
                        " bytes of DRAM (usable before eviction: " + std::to_string(static_cast<int>(kUsable * 100)) +
                        " %); use fewer --blocks or start the node with a larger "
                        "--dram-bytes");
    }
  }
  std::vector<std::vector<std::byte>> blocks(o.blocks, std::vector<std::byte>(block_bytes));
  for (uint64_t i = 0; i < o.blocks; ++i) {
    for (uint64_t j = 0; j < block_bytes; j += 4096) blocks[i][j] = static_cast<std::byte>(i + j);
    // Registered once, as a prefill/decode worker registers its KV cache: transfers use it in place.
    MC_RETURN_IF_ERROR(cl->register_buffer(blocks[i]));
  }
  std::string run = std::to_string(SteadyClock::now().time_since_epoch().count());
  nlohmann::json points = nlohmann::json::array();
  uint64_t put_bytes = 0, get_bytes = 0;
  double put_s = 0, get_s = 0;
  auto keys_of = [&](const std::string& phase, int round) {
    std::vector<std::string> keys;
    for (uint64_t i = 0; i < o.blocks; ++i) {
      keys.push_back("bench/" + run + "/" + phase + "/" + std::to_string(round) + "/" + std::to_string(i));
    }
    return keys;
  };
  // Write-behind commits, as a prefill worker storing its blocks would use them (client.hpp); the
  // round's flush() is inside the timed span.
  const WriteOptions behind{false, false, false, 0};
  auto put_round = [&](const std::vector<std::string>& keys, bool timed) -> Status {
    for (uint64_t b = 0; b < o.blocks; b += o.batch) {
      std::vector<PutItem> items;
      for (uint64_t i = b; i < std::min(o.blocks, b + o.batch); ++i) items.push_back({keys[i], blocks[i]});
      auto t = SteadyClock::now();
      MC_ASSIGN_OR_RETURN(auto st, cl->batch_put(items, behind));
      if (timed) put_s += std::chrono::duration<double>(SteadyClock::now() - t).count();
      for (const auto& s : st) {
        if (!s.is_ok()) return s.with_context("batch_put in the data benchmark");
      }
      if (timed) put_bytes += items.size() * block_bytes;
    }
    // Every commit of the round confirmed (timed): a refused one fails the benchmark.
    auto t = SteadyClock::now();
    MC_RETURN_IF_ERROR(cl->flush().with_context("commits of batch_put in the data benchmark"));
    if (timed) put_s += std::chrono::duration<double>(SteadyClock::now() - t).count();
    return Status::ok();
  };
  // Warm-up (untimed): one round put, read and removed, so the engine's connections and mappings exist
  // and the node's pages under the working set were touched once by this process.
  {
    auto keys = keys_of("warm", 0);
    MC_RETURN_IF_ERROR(put_round(keys, false));
    std::vector<GetItem> gets;
    for (uint64_t i = 0; i < o.blocks; ++i) gets.push_back({keys[i], blocks[i]});
    for (uint64_t b = 0; b < o.blocks; b += o.batch) {
      auto part = std::span<const GetItem>(gets).subspan(b, std::min(o.batch, o.blocks - b));
      MC_RETURN_IF_ERROR(cl->batch_get(part).status());
    }
    for (const auto& k : keys) (void)cl->remove(k);  // best effort: a block still leased expires later
  }
  // Puts: rounds of fresh keys, each round removed right after (never read, so never leased): the
  // allocator hands the same ranges out again and the segment never fills.
  auto deadline = SteadyClock::now() + std::chrono::duration<double>(o.duration_s);
  for (int round = 0; round == 0 || (SteadyClock::now() < deadline && round < 100000); ++round) {
    auto keys = keys_of("put", round);
    MC_RETURN_IF_ERROR(put_round(keys, true));
    for (const auto& k : keys) {
      Status s = cl->remove(k);
      // Evicted already (another writer filled the node): nothing to remove.
      if (!s.is_ok() && s.code() != Code::kObjectNotFound) return s.with_context("remove in the data benchmark");
    }
  }
  // Gets: one round of blocks stored (untimed), then read again and again until the deadline.
  auto keys = keys_of("get", 0);
  MC_RETURN_IF_ERROR(put_round(keys, false));
  deadline = SteadyClock::now() + std::chrono::duration<double>(o.duration_s);
  for (int round = 0; round == 0 || (SteadyClock::now() < deadline && round < 100000); ++round) {
    for (uint64_t b = 0; b < o.blocks; b += o.batch) {
      std::vector<GetItem> gets;
      for (uint64_t i = b; i < std::min(o.blocks, b + o.batch); ++i) gets.push_back({keys[i], blocks[i]});
      auto t = SteadyClock::now();
      MC_ASSIGN_OR_RETURN(auto gt, cl->batch_get(gets));
      get_s += std::chrono::duration<double>(SteadyClock::now() - t).count();
      for (const auto& s : gt) {
        if (!s.is_ok()) return s.with_context("batch_get in the data benchmark");
      }
      get_bytes += gets.size() * block_bytes;
    }
  }
  // Leave nothing behind once the leases end (best effort: a leased block is refused and expires later).
  for (const auto& k : keys) (void)cl->remove(k);
  const auto& c = cl->counters();
  std::string path = c.bytes_read_tcp > 0 ? "tcp" : "shm";
  double put_gbs = put_s > 0 ? put_bytes / put_s / 1e9 : 0, get_gbs = get_s > 0 ? get_bytes / get_s / 1e9 : 0;
  if (o.json) {
    out << nlohmann::json{{"build", cli::build_id()},
                          {"mode", "data"},
                          {"path", path},
                          {"block_bytes", block_bytes},
                          {"kv_bytes_per_token", o.kv_bytes_per_token},
                          {"batch", o.batch},
                          {"batch_put_bytes", put_bytes},
                          {"batch_put_bytes_per_second", put_gbs * 1e9},
                          {"batch_get_bytes", get_bytes},
                          {"batch_get_bytes_per_second", get_gbs * 1e9}}
               .dump()
        << '\n';
  } else {
    out << "mc-store bench data " << cli::build_id() << " master=" << o.client.master << " path=" << path
        << " block=" << block_bytes << " B batch=" << o.batch << '\n';
    out << std::left << std::setw(12) << "op" << std::right << std::setw(16) << "bytes" << std::setw(10) << "GB/s"
        << '\n';
    out << std::left << std::setw(12) << "batch_put" << std::right << std::setw(16) << put_bytes << std::setw(10)
        << report::fixed(put_gbs, 3) << '\n';
    out << std::left << std::setw(12) << "batch_get" << std::right << std::setw(16) << get_bytes << std::setw(10)
        << report::fixed(get_gbs, 3) << '\n';
  }
  return Status::ok();
}

}  // namespace

Status run_bench(const BenchOptions& options, std::ostream& out) {
  BenchOptions o = options;
  if (!o.client.etcd.empty()) {
    // A replicated master: the benchmark runs against the leader (its raw connections do not follow a takeover).
    MC_ASSIGN_OR_RETURN(std::shared_ptr<LeaderLocator> locator,
                        LeaderLocator::create(LeaderAddress{"", o.client.etcd, o.client.cluster_id}));
    MC_ASSIGN_OR_RETURN(LeaderInfo leader, locator->leader(o.client.rpc_timeout_ms));
    o.client.master = leader.endpoint;
  }
  if (o.mode == "data") return data_bench(o, out);
  if (o.mode != "metadata")
    return Status(Code::kInvalidArgument, "--mode must be metadata or data, not '" + o.mode + "'");
  for (const auto& op : o.ops) {
    if (!is_put(op) && op != "get" && op != "match") {
      return Status(Code::kInvalidArgument, "--ops: unknown operation '" + op + "' (put, put_sync, get, match)");
    }
  }
  if (o.transport != "fast" && o.transport != "zmq") {
    return Status(Code::kInvalidArgument, "--transport must be fast or zmq, not '" + o.transport + "'");
  }
  if (o.pipeline < 1 || o.pipeline > 1024) {
    return Status(Code::kInvalidArgument, "--pipeline: " + std::to_string(o.pipeline) + " is outside 1..1024");
  }
  if (o.transport == "zmq" && o.pipeline != 1) {
    return Status(Code::kInvalidArgument,
                  "--pipeline > 1 needs --transport fast (the ZeroMQ client waits for each reply)");
  }
  for (int64_t n : o.clients) {
    if (n < 1 || n > 256)
      return Status(Code::kInvalidArgument, "--clients: " + std::to_string(n) + " is outside 1..256");
  }
  std::string run = std::to_string(SteadyClock::now().time_since_epoch().count() % 1000000007);
  nlohmann::json arr = nlohmann::json::array();
  if (!o.json) {
    out << "mc-store bench metadata " << cli::build_id() << " master=" << o.client.master
        << " transport=" << o.transport << " pipeline=" << o.pipeline << " duration=" << o.duration_s
        << " s per point\n";
    out << std::left << std::setw(8) << "op" << std::right << std::setw(9) << "clients" << std::setw(12) << "ops"
        << std::setw(9) << "errors" << std::setw(14) << "ops/s" << '\n';
  }
  for (const auto& op : o.ops) {
    for (int64_t n : o.clients) {
      MC_ASSIGN_OR_RETURN(Point p, metadata_point(o, op, n, run + "-" + op + std::to_string(n)));
      if (o.json) {
        arr.push_back({{"op", op},
                       {"clients", n},
                       {"transport", o.transport},
                       {"pipeline", o.pipeline},
                       {"ops", p.ops},
                       {"errors", p.errors},
                       {"elapsed_ns", static_cast<int64_t>(p.seconds * 1e9)},
                       {"ops_per_second", p.rate()}});
      } else {
        out << std::left << std::setw(8) << op << std::right << std::setw(9) << n << std::setw(12) << p.ops
            << std::setw(9) << p.errors << std::setw(14) << report::fixed(p.rate(), 0) << '\n';
      }
    }
  }
  if (o.json) out << nlohmann::json{{"build", cli::build_id()}, {"mode", "metadata"}, {"points", arr}}.dump() << '\n';
  return Status::ok();
}

}  // namespace mc::store
