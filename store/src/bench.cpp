#include "mc/store/bench.hpp"

#include <atomic>
#include <chrono>
#include <iomanip>
#include <thread>

#include <nlohmann/json.hpp>

#include "mc/common/cli.hpp"
#include "mc/common/rpc.hpp"

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

// One metadata point: `clients` threads issuing `op` until the deadline or max_ops.
Result<Point> metadata_point(const BenchOptions& o, const std::string& op, int64_t clients, const std::string& run_id) {
  std::vector<std::unique_ptr<rpc::RpcClient>> conns;
  for (int64_t i = 0; i < clients; ++i) {
    rpc::ClientOptions co;
    co.client_name = "bench-" + run_id + "-" + std::to_string(i);
    MC_ASSIGN_OR_RETURN(auto c, rpc::RpcClient::connect(o.client.master, co));
    conns.push_back(std::move(c));
  }
  // Keys read by get and match: 24 blocks of one chain, stored once.
  std::vector<std::string> chain;
  for (int i = 0; i < 24; ++i) chain.push_back("bench/" + run_id + "/chain/" + std::to_string(i));
  if (op != "put") {
    MC_ASSIGN_OR_RETURN(auto cl, Client::connect(o.client));
    std::vector<std::byte> blob(4096, std::byte{1});
    for (const auto& k : chain) {
      Status s = cl->put(k, blob, {false, true});
      if (!s.is_ok() && s.code() != Code::kAlreadyExists) return s;
    }
  }
  std::atomic<uint64_t> total{0}, errors{0};
  std::atomic<bool> go{false};
  auto deadline_ns = static_cast<int64_t>(o.duration_s * 1e9);
  std::vector<std::thread> threads;
  auto t0 = SteadyClock::now();
  for (int64_t i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      while (!go.load()) std::this_thread::yield();
      rpc::RpcClient& c = *conns[i];
      std::string cid = "bench-" + run_id + "-" + std::to_string(i);
      uint64_t n = 0;
      auto start = SteadyClock::now();
      while (total.load(std::memory_order_relaxed) < o.max_ops) {
        if ((n & 15) == 0 && (SteadyClock::now() - start).count() > deadline_ns) break;
        bool ok = true;
        if (op == "put") {
          proto::StorePutStartRequest ps;
          ps.client_id = cid;
          ps.keys = {"bench/" + run_id + "/" + std::to_string(i) + "/" + std::to_string(n)};
          ps.sizes_bytes = {4096};
          auto g = c.call(ps);
          ok = g.is_ok() && g->items[0].code == 0;
          if (ok) {
            auto e = c.call(proto::StorePutEndRequest{cid, ps.keys, {g->items[0].put_id}});
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
  t0 = SteadyClock::now();
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

Status data_bench(const BenchOptions& o, std::ostream& out) {
  uint64_t block_bytes = o.kv_bytes_per_token * o.block_tokens;
  MC_ASSIGN_OR_RETURN(auto cl, Client::connect(o.client));
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
  auto put_round = [&](const std::vector<std::string>& keys, bool timed) -> Status {
    for (uint64_t b = 0; b < o.blocks; b += o.batch) {
      std::vector<PutItem> items;
      for (uint64_t i = b; i < std::min(o.blocks, b + o.batch); ++i) items.push_back({keys[i], blocks[i]});
      auto t = SteadyClock::now();
      MC_ASSIGN_OR_RETURN(auto st, cl->batch_put(items));
      if (timed) put_s += std::chrono::duration<double>(SteadyClock::now() - t).count();
      for (const auto& s : st) {
        if (!s.is_ok()) return s.with_context("batch_put in the data benchmark");
      }
      if (timed) put_bytes += items.size() * block_bytes;
    }
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
  }
  // Puts: rounds of fresh keys, each round removed right after (never read, so never leased): the
  // allocator hands the same ranges out again and the segment never fills.
  auto deadline = SteadyClock::now() + std::chrono::duration<double>(o.duration_s);
  for (int round = 0; round == 0 || (SteadyClock::now() < deadline && round < 100000); ++round) {
    auto keys = keys_of("put", round);
    MC_RETURN_IF_ERROR(put_round(keys, true));
    for (const auto& k : keys) MC_RETURN_IF_ERROR(cl->remove(k).with_context("remove in the data benchmark"));
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
    out << nlohmann::json{{"build", cli::build_id()}, {"mode", "data"}, {"path", path}, {"block_bytes", block_bytes},
                          {"kv_bytes_per_token", o.kv_bytes_per_token}, {"batch", o.batch},
                          {"batch_put_bytes", put_bytes}, {"batch_put_bytes_per_second", put_gbs * 1e9},
                          {"batch_get_bytes", get_bytes}, {"batch_get_bytes_per_second", get_gbs * 1e9}}
               .dump()
        << '\n';
  } else {
    out << "mc-store bench data " << cli::build_id() << " master=" << o.client.master << " path=" << path
        << " block=" << block_bytes << " B batch=" << o.batch << '\n';
    out << std::left << std::setw(12) << "op" << std::right << std::setw(16) << "bytes" << std::setw(10) << "GB/s" << '\n';
    out << std::left << std::setw(12) << "batch_put" << std::right << std::setw(16) << put_bytes << std::setw(10) << std::fixed
        << std::setprecision(3) << put_gbs << '\n';
    out << std::left << std::setw(12) << "batch_get" << std::right << std::setw(16) << get_bytes << std::setw(10) << get_gbs << '\n';
  }
  return Status::ok();
}

}  // namespace

Status run_bench(const BenchOptions& o, std::ostream& out) {
  if (o.mode == "data") return data_bench(o, out);
  if (o.mode != "metadata") return Status(Code::kInvalidArgument, "--mode must be metadata or data, not '" + o.mode + "'");
  for (const auto& op : o.ops) {
    if (op != "put" && op != "get" && op != "match") {
      return Status(Code::kInvalidArgument, "--ops: unknown operation '" + op + "' (put, get, match)");
    }
  }
  for (int64_t n : o.clients) {
    if (n < 1 || n > 256) return Status(Code::kInvalidArgument, "--clients: " + std::to_string(n) + " is outside 1..256");
  }
  std::string run = std::to_string(SteadyClock::now().time_since_epoch().count() % 1000000007);
  nlohmann::json arr = nlohmann::json::array();
  if (!o.json) {
    out << "mc-store bench metadata " << cli::build_id() << " master=" << o.client.master << " duration=" << o.duration_s
        << " s per point\n";
    out << std::left << std::setw(8) << "op" << std::right << std::setw(9) << "clients" << std::setw(12) << "ops" << std::setw(9)
        << "errors" << std::setw(14) << "ops/s" << '\n';
  }
  for (const auto& op : o.ops) {
    for (int64_t n : o.clients) {
      MC_ASSIGN_OR_RETURN(Point p, metadata_point(o, op, n, run + "-" + op + std::to_string(n)));
      if (o.json) {
        arr.push_back({{"op", op}, {"clients", n}, {"ops", p.ops}, {"errors", p.errors}, {"elapsed_ns", static_cast<int64_t>(p.seconds * 1e9)},
                       {"ops_per_second", p.rate()}});
      } else {
        out << std::left << std::setw(8) << op << std::right << std::setw(9) << n << std::setw(12) << p.ops << std::setw(9)
            << p.errors << std::setw(14) << std::fixed << std::setprecision(0) << p.rate() << '\n';
      }
    }
  }
  if (o.json) out << nlohmann::json{{"build", cli::build_id()}, {"mode", "metadata"}, {"points", arr}}.dump() << '\n';
  return Status::ok();
}

}  // namespace mc::store
