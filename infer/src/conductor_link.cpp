#include "mc/infer/conductor_link.hpp"

#include <unistd.h>

#include <chrono>

#include "mc/common/endpoint.hpp"
#include "mc/common/log.hpp"
#include "mc/common/report.hpp"
#include "mc/net/rpc.hpp"
#include "mc/proto/conductor.hpp"

namespace mc::infer {

ConductorHeartbeatOptions resolve_conductor_options(ConductorHeartbeatOptions o, const std::string& role) {
  if (o.host.empty()) o.host = mc::report::host_name();
  if (o.instance_id.empty()) o.instance_id = role + "-" + o.host + "-" + std::to_string(getpid());
  return o;
}

Status validate_heartbeat_options(const ConductorHeartbeatOptions& o) {
  if (o.endpoint.empty()) return Status::ok();
  Result<Endpoint> ep = parse_endpoint(o.endpoint);
  if (!ep.is_ok()) {
    return error(Code::kInvalidArgument, "--conductor '" + o.endpoint + "': " + ep.status().message());
  }
  if (o.start_wait_ms < 0) return error(Code::kInvalidArgument, "--conductor-wait-ms must be >= 0");
  return Status::ok();
}

ConductorHeartbeat::ConductorHeartbeat(ConductorHeartbeatOptions options, proto::ConductorRegisterRequest registration,
                                       std::function<proto::ConductorHeartbeatRequest()> load)
    : options_(std::move(options)), registration_(std::move(registration)), load_(std::move(load)) {
  if (!options_.endpoint.empty()) thread_ = std::thread([this] { run(); });
}

void ConductorHeartbeat::stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void ConductorHeartbeat::set_state(bool registered, std::string last_error, bool refused) {
  std::lock_guard lock(state_mu_);
  if (registered) registered_once_ = true;
  refused_ = refused;
  if (!last_error.empty()) last_error_ = std::move(last_error);
  state_cv_.notify_all();
}

Status ConductorHeartbeat::wait_registered(int64_t timeout_ms) {
  if (options_.endpoint.empty()) return Status::ok();
  std::unique_lock lock(state_mu_);
  if (state_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return registered_once_ || refused_; }) &&
      registered_once_) {
    return Status::ok();
  }
  if (refused_) {
    return error(Code::kFailedPrecondition, registration_.instance_id + ": conductor " + options_.endpoint +
                                                " refused the registration: " + last_error_ +
                                                " (give this instance and the Conductor the same setting; retrying "
                                                "cannot help)");
  }
  return error(Code::kUnavailable, registration_.instance_id + ": could not register with conductor " +
                                       options_.endpoint + " within " + std::to_string(timeout_ms) +
                                       " ms: " + last_error_ +
                                       " (is mc-conductor running there? --conductor-wait-ms waits longer)");
}

void ConductorHeartbeat::request_drain() {
  drain_.store(true);
  if (options_.endpoint.empty()) set_drain_acknowledged();  // no Conductor places anything here
}

void ConductorHeartbeat::set_drain_acknowledged() {
  std::lock_guard lock(state_mu_);
  drain_acknowledged_ = true;
  state_cv_.notify_all();
}

bool ConductorHeartbeat::drain_acknowledged() {
  std::lock_guard lock(state_mu_);
  return drain_acknowledged_;
}

void ConductorHeartbeat::run() {
  bool drain_sent = false;  // conductor.drain answered since the last registration
  // Sleeps ms, waking early to stop or to send a drain notice not sent yet.
  auto sleep_ms = [this, &drain_sent](int64_t ms) {
    for (int64_t waited = 0; waited < ms && !stop_.load() && !(drain_.load() && !drain_sent); waited += 20) {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min<int64_t>(20, ms - waited)));
    }
  };
  std::unique_ptr<rpc::RpcClient> client;
  int64_t interval_ms = 1000;
  bool registered = false;
  while (!stop_.load()) {
    if (!client) {
      rpc::ClientOptions o;
      o.client_name = registration_.instance_id;
      auto c = rpc::RpcClient::connect(options_.endpoint, o);
      if (!c.is_ok()) {
        MC_LOG_WARN << registration_.instance_id << ": conductor " << options_.endpoint
                    << " unreachable, retrying in 1 s: " << c.status().to_string();
        set_state(false, c.status().to_string());
        sleep_ms(1000);
        continue;
      }
      client = std::move(c).value();
      registered = false;
    }
    if (!registered) {
      auto r = client->call(registration_, 2000);
      if (!r.is_ok()) {
        MC_LOG_WARN << registration_.instance_id << ": registration with " << options_.endpoint
                    << " failed, retrying in 1 s: " << r.status().to_string();
        const Code code = r.status().code();
        set_state(false, r.status().to_string(), code == Code::kInvalidArgument || code == Code::kPermissionDenied);
        if (r.status().code() == Code::kTimeout || r.status().code() == Code::kUnavailable) client.reset();
        sleep_ms(1000);
        continue;
      }
      interval_ms = r->heartbeat_interval_ms > 0 ? r->heartbeat_interval_ms : 1000;
      registered = true;
      drain_sent = false;  // a new registration is placeable again until told
      set_state(true, "");
      MC_LOG_INFO << registration_.instance_id << ": registered with conductor " << options_.endpoint
                  << " (heartbeat every " << interval_ms << " ms)";
    }
    if (drain_.load() && !drain_sent) {
      auto d = client->call(proto::ConductorDrainRequest{registration_.instance_id}, 2000);
      if (!d.is_ok() && (d.status().code() == Code::kTimeout || d.status().code() == Code::kUnavailable)) {
        MC_LOG_WARN << registration_.instance_id << ": drain notice to " << options_.endpoint
                    << " failed, retrying in 200 ms: " << d.status().to_string();
        client.reset();
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        continue;
      }
      drain_sent = true;  // answered: taken, or refused for good (then not retried)
      if (!d.is_ok()) {
        // A Conductor that refuses the notice (one without conductor.drain, or a key it does not accept): the worker
        // still drains; the Conductor will count its exit as a death.
        MC_LOG_WARN << registration_.instance_id << ": conductor " << options_.endpoint
                    << " refused the drain notice (it may still place requests here for a moment): "
                    << d.status().to_string();
        continue;
      }
      set_drain_acknowledged();
      MC_LOG_INFO << registration_.instance_id << ": drain notice taken by conductor " << options_.endpoint << " ("
                  << d->requests_held << " request(s) held here run on; nothing new comes)";
    }
    proto::ConductorHeartbeatRequest hb = load_();
    hb.instance_id = registration_.instance_id;
    auto h = client->call(hb, 2000);
    if (!h.is_ok()) {
      MC_LOG_WARN << registration_.instance_id << ": heartbeat to " << options_.endpoint
                  << " failed: " << h.status().to_string();
      client.reset();
    } else {
      sent_.fetch_add(1);
      if (!h->registered) registered = false;
    }
    sleep_ms(interval_ms);
  }
}

ConductorJobReporter::ConductorJobReporter(ConductorHeartbeatOptions options) : options_(std::move(options)) {
  if (!options_.endpoint.empty()) thread_ = std::thread([this] { run(); });
}

void ConductorJobReporter::report(proto::ConductorJobReportRequest report) {
  if (options_.endpoint.empty()) return;
  report.instance_id = options_.instance_id;
  std::lock_guard lock(mu_);
  if (stopping_ || queue_.size() >= kMaxQueued) {
    dropped_.fetch_add(1);
    return;
  }
  queue_.push_back(std::move(report));
  cv_.notify_one();
}

void ConductorJobReporter::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

void ConductorJobReporter::run() {
  std::unique_ptr<rpc::RpcClient> client;
  std::chrono::steady_clock::time_point stop_deadline{};
  for (;;) {
    proto::ConductorJobReportRequest rep;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_ && stop_deadline == std::chrono::steady_clock::time_point{}) {
        stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      }
      if (queue_.empty() || (stopping_ && std::chrono::steady_clock::now() > stop_deadline)) {
        dropped_.fetch_add(queue_.size());
        return;
      }
      rep = std::move(queue_.front());
      queue_.pop_front();
    }
    if (!client) {
      rpc::ClientOptions o;
      o.client_name = options_.instance_id;
      o.connect_timeout_ms = 2000;
      auto c = rpc::RpcClient::connect(options_.endpoint, o);
      if (!c.is_ok()) {
        dropped_.fetch_add(1);
        MC_LOG_WARN << options_.instance_id << ": job report '" << rep.request_id << "' (" << rep.phase
                    << ") not sent: conductor " << options_.endpoint << " unreachable: " << c.status().to_string();
        continue;
      }
      client = std::move(c).value();
    }
    auto r = client->call(rep, 2000);
    if (!r.is_ok()) {
      dropped_.fetch_add(1);
      MC_LOG_WARN << options_.instance_id << ": job report '" << rep.request_id << "' (" << rep.phase << ") to "
                  << options_.endpoint << " failed: " << r.status().to_string();
      client.reset();
      continue;
    }
    sent_.fetch_add(1);
  }
}

}  // namespace mc::infer
