#include "mc/transfer/xfer_tool.hpp"

#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <map>
#include <sstream>
#include <string_view>
#include <thread>

#include <nlohmann/json.hpp>

#include "mc/cli/cli.hpp"
#include "mc/common/daemon.hpp"
#include "mc/common/log.hpp"
#include "mc/common/metrics.hpp"
#include "mc/common/report.hpp"
#include "mc/common/units.hpp"
#include "mc/net/auth.hpp"
#include "mc/net/daemon_stat.hpp"
#include "mc/net/metrics_http.hpp"
#include "mc/net/rpc.hpp"
#include "mc/proto/transfer.hpp"
#include "mc/transfer/shared_buffer.hpp"
#include "shm/transport.hpp"
#include "tcp/net.hpp"

namespace mc::transfer::xfer {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

uint64_t pattern_word(uint64_t word_index) { return (word_index + 1) * kGolden; }

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Client {
  std::unique_ptr<TransferEngine> engine;
  SegmentHandle seg = 0;
  proto::SegmentDescriptor desc;
  uint64_t remote_size = 0;
  std::string transport;
  std::string grant;  // carried by every request (TransferRequest::grant)
};

// The grant of a client's requests: `explicit_grant` (--grant) when given; else, when this process holds the
// cluster's grant key (an admin's or a daemon's --auth-dir), one it issues itself for read+write of the whole
// segment for 10 minutes; else none (a target that enforces grants then refuses, naming why).
Result<std::string> client_grant(const std::string& explicit_grant, const proto::SegmentDescriptor& desc,
                                 uint64_t remote_size) {
  if (!explicit_grant.empty()) return explicit_grant;
  const auth::Keyring* ring = auth::keyring();
  if (ring == nullptr || ring->grant_key().empty() || remote_size == 0) return std::string();
  auth::Grant g{desc.name,         0, remote_size, auth::kGrantRead | auth::kGrantWrite, auth::unix_now_ms() + 600000,
                ring->self().name, 0};
  return auth::issue_grant(ring->grant_key(), g);
}

Result<Client> connect_client(const EngineOptions& eo, const std::string& target, const std::string& grant) {
  if (target.empty()) return Status(Code::kInvalidArgument, "--target SEGMENT (host:port) is required");
  Client c;
  MC_ASSIGN_OR_RETURN(c.engine, TransferEngine::create(eo));
  MC_ASSIGN_OR_RETURN(c.seg, c.engine->open_segment(target));
  MC_ASSIGN_OR_RETURN(c.desc, c.engine->segment_descriptor(c.seg));
  for (const auto& r : c.desc.regions) c.remote_size = std::max(c.remote_size, r.segment_offset + r.length_bytes);
  MC_ASSIGN_OR_RETURN(c.transport, c.engine->segment_transport(c.seg));
  MC_ASSIGN_OR_RETURN(c.grant, client_grant(grant, c.desc, c.remote_size));
  return c;
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

}  // namespace

uint8_t pattern_byte(uint64_t offset) {
  const uint64_t w = pattern_word(offset / 8);
  return static_cast<uint8_t>(w >> (8 * (offset % 8)));
}

void fill_pattern(char* dst, uint64_t offset, uint64_t n, bool inverted) {
  const uint8_t x = inverted ? 0xff : 0;
  uint64_t i = 0;
  while (i < n && (offset + i) % 8 != 0) {
    dst[i] = static_cast<char>(pattern_byte(offset + i) ^ x);
    ++i;
  }
  const uint64_t xw = inverted ? ~0ull : 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t w = pattern_word((offset + i) / 8) ^ xw;
    std::memcpy(dst + i, &w, 8);
  }
  for (; i < n; ++i) dst[i] = static_cast<char>(pattern_byte(offset + i) ^ x);
}

int64_t find_pattern_mismatch(const char* src, uint64_t offset, uint64_t n, bool inverted) {
  const uint8_t x = inverted ? 0xff : 0;
  for (uint64_t i = 0; i < n; ++i) {
    if (static_cast<uint8_t>(src[i]) != (pattern_byte(offset + i) ^ x)) return static_cast<int64_t>(offset + i);
    // Fast path over aligned words.
    if ((offset + i + 1) % 8 == 0) {
      uint64_t j = i + 1;
      const uint64_t xw = inverted ? ~0ull : 0;
      while (j + 8 <= n) {
        uint64_t w;
        std::memcpy(&w, src + j, 8);
        if (w != (pattern_word((offset + j) / 8) ^ xw)) break;
        j += 8;
      }
      i = j - 1;
    }
  }
  return -1;
}

// ------------------------------------------------------------------------------------------------
// serve
// ------------------------------------------------------------------------------------------------

Status run_serve(const ServeOptions& o, std::ostream& out) {
  if (o.size_bytes == 0) return Status(Code::kInvalidArgument, "--size must be > 0");
  if (o.engine.listen.empty()) return Status(Code::kInvalidArgument, "--listen: at least one endpoint is required");
  MC_ASSIGN_OR_RETURN(auto engine, TransferEngine::create(o.engine));
  MC_ASSIGN_OR_RETURN(SharedBuffer buf, allocate_shared_buffer(o.size_bytes, "mc-xfer-serve"));
  fill_pattern(static_cast<char*>(buf.data()), 0, o.size_bytes);
  MC_ASSIGN_OR_RETURN(RegisteredRegion reg, engine->register_memory(buf.data(), o.size_bytes, o.location));
  metrics::Registry registry;
  rpc::ServerOptions so;
  so.service = "mc-xfer serve " + engine->segment_name();
  so.bind_endpoints = {o.stat_listen};
  MC_ASSIGN_OR_RETURN(auto stat_server, rpc::RpcServer::bind(so));
  auto refresh = [&] { export_served_metrics(engine->stats(), registry); };  // engine stats are atomics
  stat_server->serve_stat(&registry, refresh);
  std::vector<std::pair<std::string, std::string>> metrics_extra;
  MC_ASSIGN_OR_RETURN(
      std::unique_ptr<metrics::HttpExporter> exporter,
      metrics::start_daemon_exporter(o.metrics_listen, "mc-xfer serve", &registry, &metrics_extra, refresh));
  engine->set_notification_handler([](const Notification& n) {
    MC_LOG_INFO << "notification '" << n.tag << "' from " << (n.from.empty() ? "?" : n.from) << ": " << op_name(n.op)
                << " of " << n.length << " bytes at offset " << n.segment_offset;
  });
  std::vector<std::pair<std::string, std::string>> extra = {
      {"segment", engine->segment_name()},       {"size_bytes", std::to_string(o.size_bytes)},
      {"paths", join(engine->endpoints(), ",")}, {"regions", std::to_string(reg.region_count)},
      {"shm", reg.shm_shareable ? "yes" : "no"}, {"stat", stat_server->endpoints().at(0)}};
  extra.insert(extra.end(), metrics_extra.begin(), metrics_extra.end());
  daemon::announce_ready("mc-xfer", engine->endpoints().front(), extra);
  if (o.json) {
    out << nlohmann::json{{"segment", engine->segment_name()},
                          {"endpoints", engine->endpoints()},
                          {"size_bytes", o.size_bytes},
                          {"regions", reg.region_count},
                          {"stat", stat_server->endpoints().at(0)}}
               .dump()
        << std::endl;
  }
  while (!daemon::stop_requested()) MC_RETURN_IF_ERROR(stat_server->poll_once(50));
  MC_LOG_INFO << "mc-xfer serve: stopping";
  return Status::ok();
}

Status run_stat(const StatOptions& o, std::ostream& out) {
  if (o.endpoint.empty()) return Status(Code::kInvalidArgument, "--endpoint tcp://HOST:PORT is required");
  return daemon::print_stat(o.endpoint, o.json, o.timeout_ms, out);
}

// ------------------------------------------------------------------------------------------------
// read / write
// ------------------------------------------------------------------------------------------------

Status run_rw(const RwOptions& o, std::ostream& out) {
  EngineOptions eo = o.engine;
  eo.trace_slices = o.verbose || o.json;
  auto client = connect_client(eo, o.target, o.grant);
  if (!client.is_ok()) return report::print_error(o.json, out, client.status());
  Client& c = client.value();
  if (o.length == 0 && o.offset > c.remote_size) {
    return report::print_error(o.json, out, Status(Code::kOutOfRange, "--offset past the end of segment " + o.target));
  }
  auto buf = allocate_shared_buffer(std::max<uint64_t>(o.length, 1), "mc-xfer-client");
  if (!buf.is_ok()) return report::print_error(o.json, out, buf.status());
  char* local = static_cast<char*>(buf->data());
  auto reg = c.engine->register_memory(local, std::max<uint64_t>(o.length, 1));
  if (!reg.is_ok()) return report::print_error(o.json, out, reg.status());

  std::vector<RequestStatus> steps;
  std::vector<std::string> step_names;
  auto move = [&](Op op, const std::string& tag) {
    RequestStatus st = c.engine->transfer_sync({op, local, c.seg, o.offset, o.length, tag, c.grant}, o.timeout_ms);
    steps.push_back(st);
    step_names.push_back(op_name(op));
    return st;
  };
  Status result;
  int64_t mismatch = -1;
  if (o.op == Op::kRead) {
    RequestStatus st = move(Op::kRead, o.notify_tag);
    result = st.state == TransferState::kCompleted ? Status::ok() : st.status;
    if (result.is_ok() && o.verify) mismatch = find_pattern_mismatch(local, o.offset, o.length);
  } else if (!o.verify) {
    fill_pattern(local, o.offset, o.length);
    RequestStatus st = move(Op::kWrite, o.notify_tag);
    result = st.state == TransferState::kCompleted ? Status::ok() : st.status;
  } else {
    // Write the inverted pattern, read it back, then restore the served pattern.
    fill_pattern(local, o.offset, o.length, true);
    RequestStatus w = move(Op::kWrite, o.notify_tag);
    result = w.state == TransferState::kCompleted ? Status::ok() : w.status;
    if (result.is_ok()) {
      std::memset(local, 0, o.length);
      RequestStatus r = move(Op::kRead, "");
      result = r.state == TransferState::kCompleted ? Status::ok() : r.status;
      if (result.is_ok()) mismatch = find_pattern_mismatch(local, o.offset, o.length, true);
    }
    if (result.is_ok()) {
      fill_pattern(local, o.offset, o.length);
      RequestStatus restore = move(Op::kWrite, "");
      if (restore.state != TransferState::kCompleted) result = restore.status;
    }
  }
  if (result.is_ok() && mismatch >= 0) {
    result = Status(Code::kDataLoss, "verify: byte at segment offset " + std::to_string(mismatch) + " of " + o.target +
                                         " differs from the pattern (--verify checks the pattern of an mc-xfer serve)");
  }
  if (result.code() == Code::kPermissionDenied && c.grant.empty()) {
    const auth::Keyring* ring = auth::keyring();
    result = Status(
        result.code(),
        result.message() +
            " (the target enforces data-plane grants: give --grant TOKEN, or an --auth-dir "
            "identity that holds the cluster's grant key, e.g. --auth-name admin" +
            (ring != nullptr ? std::string("; ") + ring->self().describe() + " holds none" : std::string()) + ")");
  }

  if (o.json) {
    nlohmann::json j;
    j["target"] = o.target;
    j["transport"] = c.transport;
    j["op"] = op_name(o.op);
    j["offset_bytes"] = o.offset;
    j["length_bytes"] = o.length;
    j["verified"] = o.verify && result.is_ok();
    j["steps"] = nlohmann::json::array();
    for (size_t i = 0; i < steps.size(); ++i) {
      nlohmann::json s{{"op", step_names[i]},
                       {"state", state_name(steps[i].state)},
                       {"transferred_bytes", steps[i].transferred_bytes},
                       {"latency_ns", steps[i].latency_ns},
                       {"slice_count", steps[i].slice_count},
                       {"retried_slices", steps[i].retried_slices}};
      s["slices"] = nlohmann::json::array();
      for (const auto& t : steps[i].slices) {
        s["slices"].push_back({{"offset_bytes", o.offset + t.request_offset},
                               {"length_bytes", t.length},
                               {"path", t.path},
                               {"attempts", t.attempts},
                               {"duration_ns", t.duration_ns},
                               {"ok", t.ok}});
      }
      j["steps"].push_back(std::move(s));
    }
    if (!result.is_ok()) j.update(report::error_json(result));
    out << j.dump() << "\n";
    return result;
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    const RequestStatus& s = steps[i];
    if (o.verbose) {
      out << "# " << step_names[i] << ": " << s.slices.size() << " slices\n";
      out << std::left << std::setw(40) << "path" << std::right << std::setw(16) << "offset_bytes" << std::setw(12)
          << "bytes" << std::setw(10) << "attempts" << std::setw(12) << "time_us"
          << "  ok\n";
      for (const auto& t : s.slices) {
        out << std::left << std::setw(40) << t.path << std::right << std::setw(16) << o.offset + t.request_offset
            << std::setw(12) << t.length << std::setw(10) << t.attempts << std::setw(12)
            << report::fixed(static_cast<double>(t.duration_ns) / 1e3, 1) << "  " << (t.ok ? "yes" : "no") << "\n";
      }
    }
    const double secs = static_cast<double>(s.latency_ns) / 1e9;
    out << step_names[i] << " " << o.target << " offset " << o.offset << " length " << o.length << " via "
        << c.transport << ": " << state_name(s.state) << ", " << s.transferred_bytes << " bytes in "
        << report::fixed(secs * 1e3, 3) << " ms ("
        << report::fixed(secs > 0 ? static_cast<double>(s.transferred_bytes) / secs / 1e9 : 0, 2) << " GB/s), "
        << s.slice_count << " slices, " << s.retried_slices << " retried\n";
  }
  if (o.verify && result.is_ok()) out << "verify: ok (" << o.length << " bytes match the pattern)\n";
  return result;
}

// ------------------------------------------------------------------------------------------------
// baselines
// ------------------------------------------------------------------------------------------------

double measure_memcpy_bytes_per_second(uint64_t block_bytes, uint32_t threads, uint64_t span_bytes, double duration_s) {
  span_bytes = std::max(span_bytes, block_bytes);
  std::vector<char> src(span_bytes, 1);
  return measure_memcpy_bytes_per_second(block_bytes, threads, src.data(), span_bytes, duration_s);
}

double measure_memcpy_bytes_per_second(uint64_t block_bytes, uint32_t threads, const char* src_bytes,
                                       uint64_t span_bytes, double duration_s) {
  if (span_bytes < block_bytes) return 0;
  const uint64_t slab = std::min<uint64_t>(128ull << 20, std::max<uint64_t>(block_bytes * 32, block_bytes));
  std::vector<std::vector<char>> dst(threads, std::vector<char>(slab, 2));
  std::atomic<uint64_t> total{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  for (uint32_t t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      while (!go.load()) {
      }
      const double end = now_s() + duration_s;
      uint64_t bytes = 0, so = (t * span_bytes / threads) / block_bytes * block_bytes, d = 0;
      while (now_s() < end) {
        for (int k = 0; k < 8; ++k) {
          if (so + block_bytes > span_bytes) so = 0;
          if (d + block_bytes > slab) d = 0;
          std::memcpy(dst[t].data() + d, src_bytes + so, block_bytes);
          so += block_bytes;
          d += block_bytes;
          bytes += block_bytes;
        }
      }
      total += bytes;
    });
  }
  const double t0 = now_s();
  go = true;
  for (auto& t : ts) t.join();
  return static_cast<double>(total.load()) / (now_s() - t0);
}

Result<double> measure_raw_tcp_bytes_per_second(uint64_t block_bytes, uint32_t streams, double duration_s,
                                                uint32_t span, uint32_t sender_span) {
  span = std::max<uint32_t>(1, span);
  sender_span = std::max<uint32_t>(1, sender_span);
  uint16_t port = 0;
  MC_ASSIGN_OR_RETURN(tcp::Fd lfd, tcp::listen_on(Endpoint::tcp("127.0.0.1", 0), &port));
  std::atomic<uint64_t> received{0};
  std::vector<std::thread> receivers;
  std::vector<tcp::Fd> senders;
  Status setup;
  for (uint32_t s = 0; s < streams && setup.is_ok(); ++s) {
    auto fd = tcp::connect_blocking(Endpoint::tcp("127.0.0.1", port), "", 2000, 10000);
    if (!fd.is_ok()) {
      setup = fd.status();
      break;
    }
    senders.push_back(std::move(fd.value()));
    int cfd = ::accept(lfd.get(), nullptr, nullptr);
    if (cfd < 0) {
      setup = Status(Code::kIo, std::string("raw tcp baseline: accept on 127.0.0.1:") + std::to_string(port) + ": " +
                                    strerror(errno));
      break;
    }
    // Every buffer is written before the timed window (first-touch page faults are not the link's cost).
    receivers.emplace_back(
        [cfd, block_bytes, span, buf = std::vector<char>(block_bytes * span, 0), &received]() mutable {
          uint64_t got = 0, calls = 0;
          for (;;) {
            ssize_t k = ::recv(cfd, buf.data() + (calls++ % span) * block_bytes, block_bytes, 0);
            if (k <= 0) break;
            got += static_cast<uint64_t>(k);
          }
          received += got;
          ::close(cfd);
        });
  }
  if (!setup.is_ok()) {  // no thread may outlive this frame: end the receivers that started
    for (auto& fd : senders) ::shutdown(fd.get(), SHUT_RDWR);
    for (auto& t : receivers) t.join();
    return setup;
  }
  std::vector<std::thread> ts;
  std::vector<std::vector<char>> bufs(streams, std::vector<char>(block_bytes * sender_span, 3));
  const double t0 = now_s();
  for (uint32_t s = 0; s < streams; ++s) {
    ts.emplace_back([&, s] {
      const std::vector<char>& buf = bufs[s];
      const double end = t0 + duration_s;
      for (uint64_t calls = 0; now_s() < end; ++calls) {
        const char* at = buf.data() + (calls % sender_span) * block_bytes;
        if (!tcp::send_all(senders[s].get(), at, block_bytes, "raw tcp").is_ok()) break;
      }
      ::shutdown(senders[s].get(), SHUT_WR);
    });
  }
  for (auto& t : ts) t.join();
  for (auto& t : receivers) t.join();
  return static_cast<double>(received.load()) / (now_s() - t0);
}

Result<double> measure_remote_raw_tcp_bytes_per_second(const std::string& endpoint, const std::string& grant,
                                                       bool target_sends, uint64_t block_bytes, uint32_t streams,
                                                       double duration_s, int socket_buffer_bytes, uint32_t span,
                                                       uint32_t target_span) {
  span = std::max<uint32_t>(1, span);
  target_span = std::max<uint32_t>(1, target_span);
  if (block_bytes == 0 || block_bytes > tcp::kMaxRawChunkBytes || streams == 0 ||
      std::max(span, target_span) > tcp::kMaxRawSpanBytes / block_bytes) {
    return Status(Code::kInvalidArgument,
                  "raw tcp baseline: block of " + std::to_string(block_bytes) + " bytes (1 to " +
                      std::to_string(tcp::kMaxRawChunkBytes) + "), " + std::to_string(streams) +
                      " streams (> 0) and spans of " + std::to_string(span) + " and " + std::to_string(target_span) +
                      " blocks (at most " + std::to_string(tcp::kMaxRawSpanBytes) + " bytes each)");
  }
  MC_ASSIGN_OR_RETURN(Endpoint hp, parse_tcp_endpoint(endpoint));
  const std::string what = "raw tcp baseline to " + hp.host_port();
  std::vector<tcp::Fd> fds;
  for (uint32_t s = 0; s < streams; ++s) {
    MC_ASSIGN_OR_RETURN(tcp::Fd fd, tcp::connect_blocking(hp, "", 2000, 10000));
    tcp::tune_data_socket(fd.get(), socket_buffer_bytes);  // the sockets the engine's connections have
    tcp::WireRequest req;
    req.op = static_cast<uint8_t>(tcp::WireOp::kRawStream);
    req.reserved = target_sends ? tcp::kRawTargetSends : tcp::kRawTargetReceives;
    req.aux_bytes = static_cast<uint32_t>(grant.size());
    req.offset = block_bytes;
    req.reserved2 = target_span;
    req.length = 1ull << 50;  // until this side closes
    MC_RETURN_IF_ERROR(tcp::send_all(fd.get(), &req, sizeof req, what));
    if (!grant.empty()) MC_RETURN_IF_ERROR(tcp::send_all(fd.get(), grant.data(), grant.size(), what));
    tcp::WireReply rep;
    MC_RETURN_IF_ERROR(tcp::recv_all(fd.get(), &rep, sizeof rep, what));
    if (!tcp::reply_header_valid(rep)) return Status(Code::kMalformedMessage, what + ": bad reply header");
    std::string aux(rep.aux_bytes, '\0');
    if (!aux.empty()) MC_RETURN_IF_ERROR(tcp::recv_all(fd.get(), aux.data(), aux.size(), what));
    if (rep.code != 0) {
      return Status(static_cast<Code>(rep.code),
                    what + ": the target refused the raw stream: " + aux +
                        " (an mc-xfer serve older than the raw-stream op answers 'unknown op 7')");
    }
    if (target_span > 1 && rep.reserved2 != target_span) {
      return Status(Code::kProtocolMismatch, what + ": the target serves a span of " + std::to_string(rep.reserved2) +
                                                 " blocks, not the " + std::to_string(target_span) +
                                                 " asked (an mc-xfer serve older than raw-stream spans): upgrade it");
    }
    fds.push_back(std::move(fd));
  }
  std::atomic<uint64_t> moved{0};
  std::vector<std::thread> ts;
  // Written before the timed window, as the target's (first-touch page faults are not the link's cost).
  std::vector<std::vector<char>> bufs(streams, std::vector<char>(block_bytes * span, 3));
  const double t0 = now_s();
  for (uint32_t s = 0; s < streams; ++s) {
    ts.emplace_back([&, s] {
      std::vector<char>& buf = bufs[s];
      const double end = t0 + duration_s;
      uint64_t n = 0, calls = 0;
      while (now_s() < end) {
        char* at = buf.data() + (calls++ % span) * block_bytes;
        const ssize_t k = target_sends ? ::recv(fds[s].get(), at, block_bytes, 0)
                                       : ::send(fds[s].get(), at, block_bytes, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        n += static_cast<uint64_t>(k);
      }
      moved += n;
    });
  }
  for (auto& t : ts) t.join();
  const double elapsed = now_s() - t0;
  for (auto& fd : fds) ::shutdown(fd.get(), SHUT_RDWR);  // the target's loop ends at the reset or EOF
  return static_cast<double>(moved.load()) / elapsed;
}

// ------------------------------------------------------------------------------------------------
// bench
// ------------------------------------------------------------------------------------------------

namespace {

struct BenchRow {
  uint64_t block_bytes = 0;
  uint64_t requests = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  double bytes_per_second = 0;
  int64_t p50_ns = 0, p99_ns = 0, p999_ns = 0;
  std::vector<std::pair<std::string, double>> path_share;
  std::map<std::string, uint64_t> counters;  // EngineStats::transport_counters, delta over the row
  double cpu_s = 0;                          // user + system CPU of this (client) process over the row
  double server_cpu_s = -1;                  // the same of the serving process (visible here only; -1: unknown)
  uint64_t failed = 0;
  std::string error;
};

double process_cpu_s() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

// utime + stime of process `pid` from /proc/PID/stat (0 when unreadable).
double process_cpu_s_of(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 2));
  std::string f;
  double ticks = 0;
  for (int i = 3; fields >> f; ++i) {  // field 3 is the state; 14 utime, 15 stime
    if (i == 14 || i == 15) ticks += std::strtod(f.c_str(), nullptr);
    if (i == 15) break;
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Whether /proc/PID of the descriptor's pid is the serving process: it runs on this host, or on this machine
// in another network namespace (a namespace "host": the same boot id, and /proc/PID/ns/net is the namespace its
// host_id names, shm::local_host_id()).
bool server_process_visible(const proto::SegmentDescriptor& d) {
  if (d.pid <= 0) return false;
  const std::string mine = shm::local_host_id();
  if (d.host_id == mine) return true;
  auto boot = [](const std::string& h) { return h.substr(0, h.find('/')); };
  if (boot(d.host_id) != boot(mine)) return false;
  std::error_code ec;
  const std::string net = std::filesystem::read_symlink("/proc/" + std::to_string(d.pid) + "/ns/net", ec).string();
  const size_t slash = d.host_id.rfind('/');
  return !ec && !net.empty() && slash != std::string::npos && d.host_id.compare(slash + 1, std::string::npos, net) == 0;
}

uint64_t counter(const BenchRow& r, const std::string& name) {
  auto it = r.counters.find(name);
  return it == r.counters.end() ? 0 : it->second;
}

// Per-row cost figures of the tcp data path (issue 3: bytes per wakeup, system calls per MiB).
double per(uint64_t num, uint64_t den) { return den == 0 ? 0 : static_cast<double>(num) / static_cast<double>(den); }

int64_t percentile(std::vector<int64_t>& v, double q) {
  if (v.empty()) return 0;
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v.end());
  return v[i];
}

// One limit measured by --baseline: memcpy with n threads, or raw tcp with n streams, at `block`.
struct BenchLimit {
  std::string kind;  // "memcpy" | "tcp_raw" (one block-sized buffer per stream end) | "tcp_raw_mem" (span blocks)
  uint32_t n;
  uint64_t block;
  double bps;
  double cpu_s_per_gb;       // CPU of both ends per 1e9 bytes moved (the target's only when its process is visible)
  uint32_t span = 1;         // blocks each stream cycles through at this end (tcp_raw_mem)
  uint32_t target_span = 1;  // ... and at the target's end
};

// The spans of the "same memory" raw tcp limit at `block` with `streams` streams: together they touch as much
// memory at each end as one engine row does, so both sides of the ratio pay the same cache misses: this end the
// row's buffers (batch x block per submitting thread), the target the swept range of its segment, at most half of
// what a target lends raw streams at once (tcp::kMaxRawSpanBytes / 2 in all: the x4 streams just before may still
// hold theirs, and a second bench may share the target). {initiator's span, target's span}.
std::pair<uint32_t, uint32_t> same_memory_spans(const BenchOptions& o, uint64_t remote_size, uint64_t block,
                                                uint32_t streams) {
  const uint64_t cap = std::max<uint64_t>(1, tcp::kMaxRawSpanBytes / 2 / (block * streams));
  const uint64_t here = (static_cast<uint64_t>(o.batch) * o.threads + streams - 1) / streams;
  const uint64_t there = remote_size / block / streams;
  return {static_cast<uint32_t>(std::clamp<uint64_t>(here, 1, cap)),
          static_cast<uint32_t>(std::clamp<uint64_t>(there, 1, cap))};
}

// Where the raw tcp limits ran: to the target's host (the bench's own endpoint, WireOp::kRawStream), or on
// loopback inside this process when the target cannot serve raw streams (the reason in `note`).
struct RawTcpWhere {
  std::string endpoint;  // "tcp://10.77.0.1:4000"; empty: loopback in this process
  std::string note;
  std::string mem_note;  // why a same-memory limit was not measured (the target refused it); the others are kept
};

// Phase 1 (--baseline): the limits, for every block: memcpy x1 and x2 (from a source of up to 1 GiB,
// allocated and touched once for all blocks), raw tcp x1 and x4; when each runs: run_bench.
// The memcpy limits at `block`: x1 and x2 threads from `memcpy_src`, each for min(duration, 2 s).
void measure_memcpy_limits(const BenchOptions& o, uint64_t block, const std::vector<char>& memcpy_src,
                           std::vector<BenchLimit>* base) {
  const double d = std::min(o.duration_s, 2.0);
  for (uint32_t th : {1u, 2u}) {
    // The byte count is recovered from the rate and the measured time (the functions return rates).
    const double c0 = process_cpu_s(), t0 = now_s();
    const double bps = measure_memcpy_bytes_per_second(block, th, memcpy_src.data(), memcpy_src.size(), d);
    const double bytes = bps * (now_s() - t0);
    base->push_back({"memcpy", th, block, bps, bytes > 0 ? (process_cpu_s() - c0) / (bytes / 1e9) : 0});
  }
}

// The raw tcp limits at `block`, each for min(duration, 2 s), between this host and the target's
// (`where->endpoint`, the segment's first; the same direction as the rows: the target sends for reads), with the
// socket buffers of the engine's connections, so the ratio compares the engine with plain sends over the same
// link: x1 and x4 streams from and into one block-sized buffer per stream end ("tcp_raw", cache-resident as an
// iperf buffer), then x4 streams cycling through the row's memory footprint ("tcp_raw_mem", same_memory_spans).
// When the target cannot serve raw streams, on loopback in this process from then on (the reason in
// where->note). The target's CPU counts when its process is visible here (`server_cpu_s`).
void measure_tcp_limits(const BenchOptions& o, const Client& c, uint64_t block,
                        const std::function<double()>& server_cpu_s, RawTcpWhere* where,
                        std::vector<BenchLimit>* base) {
  const double d = std::min(o.duration_s, 2.0);
  struct Kind {
    const char* kind;
    uint32_t streams;
    std::pair<uint32_t, uint32_t> spans;
  };
  for (const Kind& k : {Kind{"tcp_raw", 1, {1, 1}}, Kind{"tcp_raw", 4, {1, 1}},
                        Kind{"tcp_raw_mem", 4, same_memory_spans(o, c.remote_size, block, 4)}}) {
    const double c0 = process_cpu_s(), s0 = server_cpu_s(), t0 = now_s();
    Result<double> r = Status(Code::kUnavailable, "");
    const bool same_memory = std::string_view(k.kind) == "tcp_raw_mem";
    if (!where->endpoint.empty()) {
      r = measure_remote_raw_tcp_bytes_per_second(where->endpoint, c.grant, o.op == Op::kRead, block, k.streams, d,
                                                  o.engine.socket_buffer_bytes, k.spans.first, k.spans.second);
      if (!r.is_ok() && same_memory) {
        // A target that cannot serve this one (its raw budget busy, no spans): no same-memory limit at this block
        // (no ratio), while the plain limits stay on the target's link rather than moving to loopback.
        where->mem_note = r.status().message();
        base->push_back({k.kind, k.streams, block, 0, 0, k.spans.first, k.spans.second});
        continue;
      }
      if (!r.is_ok()) {
        where->note = r.status().message();
        where->endpoint.clear();
      }
    }
    const bool remote = !where->endpoint.empty();
    if (!remote) {  // this process receives for reads, as the initiator does
      const bool reads = o.op == Op::kRead;
      r = measure_raw_tcp_bytes_per_second(block, k.streams, d, reads ? k.spans.first : k.spans.second,
                                           reads ? k.spans.second : k.spans.first);
    }
    const double bytes = r.is_ok() ? r.value() * (now_s() - t0) : 0;
    const double cpu = process_cpu_s() - c0 + (remote ? server_cpu_s() - s0 : 0);
    base->push_back({k.kind, k.streams, block, r.is_ok() ? r.value() : 0, bytes > 0 ? cpu / (bytes / 1e9) : 0,
                     k.spans.first, k.spans.second});
  }
}

struct BenchWarmup {
  uint64_t bytes = 0;
  double seconds = 0;
};

// Phase 2 (untimed warm-up): one READ pass over the range the rows sweep, in the largest block, `o.batch`
// requests at a time into `local` (bounded to 60 s). kTransferFailed naming the offset when a batch fails.
Result<BenchWarmup> warm_up(const BenchOptions& o, Client& c, char* local, uint64_t max_block) {
  BenchWarmup w;
  const double w0 = now_s();
  const uint64_t span = c.remote_size / max_block * max_block;
  std::vector<TransferRequest> reqs;
  for (uint64_t off = 0; off < span && now_s() - w0 < 60; off += max_block * o.batch) {
    reqs.clear();
    for (uint32_t i = 0; i < o.batch && off + (i + 1) * max_block <= span; ++i) {
      reqs.push_back(
          TransferRequest{Op::kRead, local + i * max_block, c.seg, off + i * max_block, max_block, "", c.grant});
    }
    auto id = c.engine->submit(reqs);
    if (!id.is_ok()) return id.status().with_context("bench warm-up");
    auto st = c.engine->wait(id.value(), o.engine.request_timeout_ms + 5000);
    if (!st.is_ok() || st->state != TransferState::kCompleted) {
      return Status(Code::kTransferFailed, "bench warm-up at offset " + std::to_string(off) + ": " +
                                               (st.is_ok() ? st->status.message() : st.status().message()));
    }
    w.bytes += st->transferred_bytes;
    (void)c.engine->free_batch(id.value());
  }
  w.seconds = now_s() - w0;
  return w;
}

// Phase 3: one row, `o.threads` threads each submitting batches of `o.batch` requests of `block` bytes for
// `o.duration_s` (at least one batch each), thread t from its own `slab` bytes of `buf` and its own part of
// the remote range. The row's error is the first failure seen (the threads stop at their first).
// `server_cpu_s`: the serving process's CPU seconds so far (its process visible here only, else -1 in the row).
BenchRow run_row(const BenchOptions& o, Client& c, char* buf, uint64_t slab, uint64_t block, bool same_host,
                 const std::function<double()>& server_cpu_s) {
  const bool tty = isatty(STDERR_FILENO) != 0;
  const auto before = c.engine->path_stats(c.seg).value_or({});
  const EngineStats stats_before = c.engine->stats();
  const double cpu_before = process_cpu_s();
  const double server_cpu_before = server_cpu_s();
  std::vector<std::vector<int64_t>> lat(o.threads);
  std::vector<uint64_t> bytes(o.threads, 0), fails(o.threads, 0);
  std::vector<std::string> errs(o.threads);
  const uint64_t span = c.remote_size / block * block;
  std::vector<std::thread> ts;
  const double t0 = now_s();
  for (uint32_t t = 0; t < o.threads; ++t) {
    ts.emplace_back([&, t] {
      char* local = buf + t * slab;
      uint64_t remote = (span / o.threads * t) / block * block;
      std::vector<TransferRequest> reqs(o.batch);
      const double end = t0 + o.duration_s;
      do {  // at least one batch per thread, however late the thread starts
        for (uint32_t i = 0; i < o.batch; ++i) {
          if (remote + block > span) remote = 0;
          reqs[i] = TransferRequest{o.op, local + i * block, c.seg, remote, block, "", c.grant};
          remote += block;
        }
        auto id = c.engine->submit(reqs);
        if (!id.is_ok()) {
          errs[t] = id.status().message();
          return;
        }
        auto st = c.engine->wait(id.value(), o.engine.request_timeout_ms + 5000);
        if (!st.is_ok() || st->state == TransferState::kPending) {
          errs[t] = st.is_ok() ? "batch did not finish" : st.status().message();
          return;
        }
        for (const auto& r : st->requests) {
          if (r.state == TransferState::kCompleted) {
            lat[t].push_back(r.latency_ns);
            bytes[t] += r.transferred_bytes;
          } else {
            fails[t]++;
            errs[t] = r.status.message();
          }
        }
        (void)c.engine->free_batch(id.value());
        if (fails[t] > 0) return;
      } while (now_s() < end);
    });
  }
  if (tty)
    std::cerr << "mc-xfer bench: block " << units::format_bytes(static_cast<int64_t>(block)) << " ...\r" << std::flush;
  for (auto& t : ts) t.join();
  BenchRow row;
  row.block_bytes = block;
  row.seconds = now_s() - t0;
  std::vector<int64_t> all;
  for (uint32_t t = 0; t < o.threads; ++t) {
    all.insert(all.end(), lat[t].begin(), lat[t].end());
    row.bytes += bytes[t];
    row.failed += fails[t];
    if (row.error.empty()) row.error = errs[t];
  }
  row.requests = all.size();
  row.bytes_per_second = static_cast<double>(row.bytes) / row.seconds;
  row.cpu_s = process_cpu_s() - cpu_before;
  row.server_cpu_s = same_host ? server_cpu_s() - server_cpu_before : -1;
  for (const auto& [k, v] : c.engine->stats().transport_counters) {
    auto it = stats_before.transport_counters.find(k);
    row.counters[k] = v - (it == stats_before.transport_counters.end() ? 0 : it->second);
  }
  row.p50_ns = percentile(all, 0.50);
  row.p99_ns = percentile(all, 0.99);
  row.p999_ns = percentile(all, 0.999);
  const auto after = c.engine->path_stats(c.seg).value_or({});
  uint64_t total = 0;
  std::vector<uint64_t> delta(after.size(), 0);
  for (size_t i = 0; i < after.size(); ++i) {
    delta[i] = after[i].state.bytes_done - (i < before.size() ? before[i].state.bytes_done : 0);
    total += delta[i];
  }
  for (size_t i = 0; i < after.size(); ++i) {
    row.path_share.emplace_back(after[i].state.label,
                                total ? static_cast<double>(delta[i]) / static_cast<double>(total) : 0);
  }
  return row;
}

// Phase 4: what the report writers read.
struct BenchReport {
  const BenchOptions& o;
  const Client& c;
  std::vector<BenchRow> rows;
  std::vector<BenchLimit> base;  // empty without --baseline
  RawTcpWhere raw_where;         // where base's tcp_raw rows ran
  BenchWarmup warmup;
  std::vector<std::string> path_labels;
  Status result;  // the failed row's error (the rows stop at the first), else ok

  // The limit a row is compared with: memcpy x min(threads, 2) for shm, the best raw tcp otherwise.
  std::pair<std::string, double> limit_for(uint64_t block) const {
    double best = 0;
    std::string what;
    for (const auto& b : base) {
      if (b.block != block) continue;
      if (c.transport == "shm" && b.kind == "memcpy" && b.n == std::min<uint32_t>(o.threads, 2)) {
        return {"memcpy x" + std::to_string(b.n), b.bps};
      }
      if (c.transport != "shm" && b.kind == "tcp_raw" && b.bps > best) {
        best = b.bps;
        what = limit_name(b);
      }
    }
    return {what, best};
  }
  // The second limit of a tcp or rdma row: raw tcp through as much memory as the row touches ({"", 0}: none).
  std::pair<std::string, double> same_memory_limit_for(uint64_t block) const {
    for (const auto& b : base) {
      if (c.transport != "shm" && b.block == block && b.kind == "tcp_raw_mem") return {limit_name(b), b.bps};
    }
    return {"", 0};
  }
  static std::string limit_name(const BenchLimit& b) {
    if (b.kind == "memcpy") return "memcpy x" + std::to_string(b.n);
    if (b.kind == "tcp_raw_mem") return "raw tcp x" + std::to_string(b.n) + " through the row's memory";
    return "raw tcp x" + std::to_string(b.n);
  }
  // CPU per GB of the limit named `what` ("memcpy x1", "raw tcp x4") at `block`.
  double limit_cpu_for(uint64_t block, const std::string& what) const {
    for (const auto& b : base) {
      if (b.block == block && limit_name(b) == what) return b.cpu_s_per_gb;
    }
    return 0;
  }
  // CPU per GB of the engine: client plus server (when known; shm's server does no work per byte).
  static double engine_cpu_per_gb(const BenchRow& r) {
    if (r.bytes == 0) return 0;
    return (r.cpu_s + std::max(0.0, r.server_cpu_s)) / (static_cast<double>(r.bytes) / 1e9);
  }
};

// The report as one JSON document (--json).
void write_bench_json(const BenchReport& rep, std::ostream& out) {
  nlohmann::json j;
  j["tool"] = "mc-xfer bench";
  j["build"] = cli::build_id();
  j["host"] = report::host_name();
  j["unix_time_ms"] = unix_time_ms();
  j["target"] = rep.o.target;
  j["transport"] = rep.c.transport;
  j["op"] = op_name(rep.o.op);
  j["threads"] = rep.o.threads;
  j["batch"] = rep.o.batch;
  j["duration_s"] = rep.o.duration_s;
  j["slice_bytes"] = rep.o.engine.slicing.slice_bytes;
  j["warmup_bytes"] = rep.warmup.bytes;
  j["warmup_ns"] = static_cast<int64_t>(rep.warmup.seconds * 1e9);
  j["paths"] = rep.path_labels;
  j["results"] = nlohmann::json::array();
  for (const auto& r : rep.rows) {
    nlohmann::json jr{{"block_bytes", r.block_bytes},
                      {"requests", r.requests},
                      {"bytes", r.bytes},
                      {"elapsed_ns", static_cast<int64_t>(r.seconds * 1e9)},
                      {"bytes_per_second", r.bytes_per_second},
                      {"latency_p50_ns", r.p50_ns},
                      {"latency_p99_ns", r.p99_ns},
                      {"latency_p999_ns", r.p999_ns},
                      {"failed_requests", r.failed}};
    jr["path_share"] = nlohmann::json::object();
    for (const auto& [label, share] : r.path_share) jr["path_share"][label] = share;
    jr["client_cpu_s"] = r.cpu_s;
    if (r.server_cpu_s >= 0) jr["server_cpu_s"] = r.server_cpu_s;
    jr["transport_counters"] = r.counters;
    if (counter(r, "tcp_bytes") > 0) {
      jr["tcp_bytes_per_wakeup"] = per(counter(r, "tcp_bytes"), counter(r, "tcp_wakeups"));
      jr["tcp_bytes_per_wire_op"] = per(counter(r, "tcp_bytes"), counter(r, "tcp_wire_ops"));
      jr["tcp_syscalls_per_mib"] =
          per((counter(r, "tcp_send_calls") + counter(r, "tcp_recv_calls")) << 20, counter(r, "tcp_bytes"));
    }
    if (rep.o.baseline) {
      auto [what, lim] = rep.limit_for(r.block_bytes);
      const double lim_cpu = rep.limit_cpu_for(r.block_bytes, what);
      jr["limit"] = what;
      jr["limit_bytes_per_second"] = lim;
      jr["ratio_to_limit"] = lim > 0 ? r.bytes_per_second / lim : 0;
      if (lim_cpu > 0 && BenchReport::engine_cpu_per_gb(r) > 0) {
        jr["limit_cpu_s_per_gb"] = lim_cpu;
        jr["cpu_s_per_gb"] = BenchReport::engine_cpu_per_gb(r);
        jr["cpu_efficiency_ratio"] = lim_cpu / BenchReport::engine_cpu_per_gb(r);
      }
      if (auto [mem_what, mem_lim] = rep.same_memory_limit_for(r.block_bytes); mem_lim > 0) {
        jr["limit_same_memory"] = mem_what;
        jr["limit_same_memory_bytes_per_second"] = mem_lim;
        jr["ratio_to_same_memory"] = r.bytes_per_second / mem_lim;
        jr["limit_same_memory_cpu_s_per_gb"] = rep.limit_cpu_for(r.block_bytes, mem_what);
      }
    }
    j["results"].push_back(std::move(jr));
  }
  if (rep.o.baseline) {
    j["baseline_tcp_raw_endpoint"] = rep.raw_where.endpoint.empty() ? "loopback" : rep.raw_where.endpoint;
    if (!rep.raw_where.note.empty()) j["baseline_tcp_raw_note"] = rep.raw_where.note;
    if (!rep.raw_where.mem_note.empty()) j["baseline_tcp_raw_mem_note"] = rep.raw_where.mem_note;
    j["baseline"] = nlohmann::json::array();
    for (const auto& b : rep.base) {
      nlohmann::json jb{{"kind", b.kind},
                        {b.kind == "memcpy" ? "threads" : "streams", b.n},
                        {"block_bytes", b.block},
                        {"bytes_per_second", b.bps},
                        {"cpu_s_per_gb", b.cpu_s_per_gb}};
      if (b.kind == "tcp_raw_mem") {
        jb["span_bytes_per_stream"] = b.block * b.span;
        jb["target_span_bytes_per_stream"] = b.block * b.target_span;
      }
      j["baseline"].push_back(std::move(jb));
    }
  }
  if (!rep.result.is_ok()) j.update(report::error_json(rep.result));
  out << j.dump(2) << "\n";
}

// The report as a table (the default).
void write_bench_table(const BenchReport& rep, std::ostream& out) {
  out << "# mc-xfer bench  build " << cli::build_id() << "  host " << report::host_name() << "\n"
      << "# target " << rep.o.target << "  transport " << rep.c.transport << "  op " << op_name(rep.o.op)
      << "  threads " << rep.o.threads << "  batch " << rep.o.batch << "  duration " << rep.o.duration_s << " s  slice "
      << units::format_bytes(static_cast<int64_t>(rep.o.engine.slicing.slice_bytes)) << "\n"
      << "# paths: " << join(rep.path_labels, ", ") << "\n"
      << "# warm-up (untimed): " << rep.warmup.bytes << " bytes read in " << report::fixed(rep.warmup.seconds, 2)
      << " s\n"
      << "# GB/s is decimal (1e9 bytes per second); latency is per request, submit to completion\n";
  out << std::right << std::setw(12) << "block_bytes" << std::setw(10) << "requests" << std::setw(15) << "bytes"
      << std::setw(9) << "GB/s" << std::setw(11) << "p50_us" << std::setw(11) << "p99_us" << std::setw(11) << "p999_us";
  if (rep.o.baseline) {
    out << std::setw(14) << "limit_GB/s" << std::setw(8) << "ratio" << std::setw(11) << "cpu_s/GB" << std::setw(17)
        << "limit_cpu_s/GB" << std::setw(11) << "cpu_ratio";
    if (rep.c.transport != "shm") out << std::setw(11) << "mem_ratio";
    out << "  limit";
  }
  out << "  path_share\n";
  for (const auto& r : rep.rows) {
    out << std::setw(12) << r.block_bytes << std::setw(10) << r.requests << std::setw(15) << r.bytes << std::setw(9)
        << report::fixed(r.bytes_per_second / 1e9, 2) << std::setw(11)
        << report::fixed(static_cast<double>(r.p50_ns) / 1e3, 1) << std::setw(11)
        << report::fixed(static_cast<double>(r.p99_ns) / 1e3, 1) << std::setw(11)
        << report::fixed(static_cast<double>(r.p999_ns) / 1e3, 1);
    if (rep.o.baseline) {
      auto [what, lim] = rep.limit_for(r.block_bytes);
      const double lim_cpu = rep.limit_cpu_for(r.block_bytes, what), cpu = BenchReport::engine_cpu_per_gb(r);
      out << std::setw(14) << report::fixed(lim / 1e9, 2) << std::setw(8)
          << report::fixed(lim > 0 ? r.bytes_per_second / lim : 0, 2) << std::setw(11) << report::fixed(cpu, 3)
          << std::setw(17) << report::fixed(lim_cpu, 3) << std::setw(11)
          << report::fixed(cpu > 0 ? lim_cpu / cpu : 0, 2);
      if (rep.c.transport != "shm") {
        const double mem_lim = rep.same_memory_limit_for(r.block_bytes).second;
        out << std::setw(11) << report::fixed(mem_lim > 0 ? r.bytes_per_second / mem_lim : 0, 2);
      }
      out << "  " << what;
    }
    out << "  ";
    for (size_t i = 0; i < r.path_share.size(); ++i) {
      out << (i ? " " : "") << r.path_share[i].first << "=" << report::fixed(100 * r.path_share[i].second, 0) << "%";
    }
    out << "\n";
  }
  if (std::any_of(rep.rows.begin(), rep.rows.end(), [](const BenchRow& r) { return counter(r, "tcp_bytes") > 0; })) {
    out << "# client data path (tcp): costs per row\n";
    out << std::setw(12) << "block_bytes" << std::setw(10) << "wire_ops" << std::setw(16) << "bytes/wire_op"
        << std::setw(15) << "bytes/wakeup" << std::setw(14) << "syscalls/MiB" << std::setw(13) << "cpu_s/GB"
        << std::setw(8) << "conns"
        << "\n";
    for (const auto& r : rep.rows) {
      const uint64_t b = counter(r, "tcp_bytes");
      out << std::setw(12) << r.block_bytes << std::setw(10) << counter(r, "tcp_wire_ops") << std::setw(16)
          << report::fixed(per(b, counter(r, "tcp_wire_ops")), 0) << std::setw(15)
          << report::fixed(per(b, counter(r, "tcp_wakeups")), 0) << std::setw(14)
          << report::fixed(per((counter(r, "tcp_send_calls") + counter(r, "tcp_recv_calls")) << 20, b), 1)
          << std::setw(13) << report::fixed(r.bytes > 0 ? r.cpu_s / (static_cast<double>(r.bytes) / 1e9) : 0, 3)
          << std::setw(8) << counter(r, "tcp_connections_opened") << "\n";
    }
  }
  if (rep.o.baseline) {
    out << "# limits measured in this run (GB/s); raw tcp "
        << (rep.raw_where.endpoint.empty()
                ? "on loopback in this process" +
                      (rep.raw_where.note.empty() ? std::string() : " (" + rep.raw_where.note + ")")
                : "between this host and " + rep.raw_where.endpoint + " (the target " +
                      (rep.o.op == Op::kRead ? "sends" : "receives") + ")")
        << "\n";
    if (!rep.raw_where.mem_note.empty()) {
      out << "# raw tcp through the row's memory not measured where 0 (no mem_ratio): " << rep.raw_where.mem_note
          << "\n";
    }
    out << std::setw(12) << "block_bytes" << std::setw(12) << "memcpy_x1" << std::setw(12) << "memcpy_x2"
        << std::setw(12) << "tcp_raw_x1" << std::setw(12) << "tcp_raw_x4" << std::setw(16) << "tcp_raw_x4_mem"
        << "  (mem: the streams cycle through as much memory as the row: its buffers here, the swept range there)\n";
    for (uint64_t block : rep.o.block_bytes) {
      out << std::setw(12) << block;
      for (const auto& b : rep.base) {
        if (b.block == block) out << std::setw(b.kind == "tcp_raw_mem" ? 16 : 12) << report::fixed(b.bps / 1e9, 2);
      }
      out << "\n";
    }
  }
}

}  // namespace

Status run_bench(const BenchOptions& o, std::ostream& out) {
  if (o.threads == 0 || o.batch == 0 || o.duration_s <= 0 || o.block_bytes.empty()) {
    return report::print_error(
        o.json, out, Status(Code::kInvalidArgument, "--threads, --batch, --duration and --block must be > 0"));
  }
  auto client = connect_client(o.engine, o.target, o.grant);
  if (!client.is_ok()) return report::print_error(o.json, out, client.status());
  Client& c = client.value();
  const uint64_t max_block = *std::max_element(o.block_bytes.begin(), o.block_bytes.end());
  if (max_block == 0 || max_block > c.remote_size) {
    return report::print_error(
        o.json, out,
        Status(Code::kInvalidArgument,
               "--block sizes must be > 0 and at most the segment size (" + std::to_string(c.remote_size) + " bytes)"));
  }
  const uint64_t slab = max_block * o.batch;
  auto buf = allocate_shared_buffer(slab * o.threads, "mc-xfer-bench");
  if (!buf.is_ok()) return report::print_error(o.json, out, buf.status());
  std::memset(buf->data(), 5, slab * o.threads);
  auto reg = c.engine->register_memory(buf->data(), slab * o.threads);
  if (!reg.is_ok()) return report::print_error(o.json, out, reg.status());
  char* local = static_cast<char*>(buf->data());
  // The serving process's CPU, when it runs on this machine (/proc/PID/stat of the descriptor's pid): with the
  // client's, the engine's CPU per byte, comparable with the baselines' (both ends in one process) on a
  // machine too loaded for wall-clock rates to mean much.
  const bool same_host = server_process_visible(c.desc);
  auto server_cpu_s = [&]() -> double { return same_host ? process_cpu_s_of(c.desc.pid) : 0; };

  BenchReport rep{o, c, {}, {}, {}, {}, {}, Status::ok()};
  // The limits (--baseline). memcpy, and for shm everything, before the warm-up and the rows, back to back:
  // touching the baseline's own gigabyte between engine rows evicted the peer mapping's pages from the (shadow)
  // page tables of this guest, and the next small-block shm row paid first-touch faults again. For tcp and rdma
  // the raw tcp limit of a block runs right before that block's row (it touches no segment memory), so the two
  // sides of a ratio are seconds apart rather than the whole run: on a shared machine the load drifts.
  const bool shm_rows = c.transport == "shm";
  rep.raw_where.endpoint = c.desc.endpoints.empty() ? std::string() : c.desc.endpoints.front();
  if (rep.raw_where.endpoint.empty()) rep.raw_where.note = "segment " + c.desc.name + " publishes no tcp endpoint";
  if (o.baseline) {
    std::vector<char> memcpy_src(std::min<uint64_t>(c.remote_size, 1ull << 30), 1);
    for (uint64_t block : o.block_bytes) {
      measure_memcpy_limits(o, block, memcpy_src, &rep.base);
      if (shm_rows) measure_tcp_limits(o, c, block, server_cpu_s, &rep.raw_where, &rep.base);
    }
  }
  if (o.warmup) {
    auto w = warm_up(o, c, local, max_block);
    if (!w.is_ok()) return report::print_error(o.json, out, w.status());
    rep.warmup = w.value();
  }
  for (uint64_t block : o.block_bytes) {
    if (o.baseline && !shm_rows) measure_tcp_limits(o, c, block, server_cpu_s, &rep.raw_where, &rep.base);
    rep.rows.push_back(run_row(o, c, local, slab, block, same_host, server_cpu_s));
    if (!rep.rows.back().error.empty()) break;
  }

  if (auto ps = c.engine->path_stats(c.seg); ps.is_ok()) {
    for (const auto& p : ps.value()) rep.path_labels.push_back(p.state.label);
  }
  for (const auto& r : rep.rows) {
    if (!r.error.empty()) {
      rep.result = Status(Code::kTransferFailed, "bench at block " + std::to_string(r.block_bytes) + ": " + r.error);
    }
  }
  if (o.json) {
    write_bench_json(rep, out);
  } else {
    write_bench_table(rep, out);
  }
  return rep.result;
}

// ------------------------------------------------------------------------------------------------
// topo
// ------------------------------------------------------------------------------------------------

Status run_topo(const TopoOptions& o, std::ostream& out) {
  auto t = o.topology_file.empty() ? Topology::discover() : Topology::load(o.topology_file);
  if (!t.is_ok()) return report::print_error(o.json, out, t.status());
  if (o.json) {
    out << t->to_json(2) << "\n";
    return Status::ok();
  }
  out << "# devices\n"
      << std::left << std::setw(16) << "device" << std::setw(7) << "kind" << std::setw(11) << "numa_node"
      << "addresses\n";
  for (const auto& d : t->devices()) {
    out << std::setw(16) << d.name << std::setw(7) << d.kind << std::setw(11) << d.numa_node << join(d.addresses, ",")
        << "\n";
  }
  out << "# matrix (location -> preferred | fallback devices)\n"
      << std::setw(12) << "location" << std::setw(40) << "preferred"
      << "fallback\n";
  for (const auto& [loc, e] : t->matrix()) {
    out << std::setw(12) << loc << std::setw(40) << join(e.preferred, ",") << join(e.fallback, ",") << "\n";
  }
  return Status::ok();
}

}  // namespace mc::transfer::xfer
