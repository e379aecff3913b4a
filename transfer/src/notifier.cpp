#include "notifier.hpp"

#include <algorithm>
#include <chrono>
#include <iterator>

#include "mc/common/log.hpp"
#include "mc/proto/codec.hpp"
#include "mc/proto/transfer.hpp"

namespace mc::transfer {

std::string pack_notification(const TransferRequest& request, const std::string& from) {
  proto::TransferNotification n;
  n.tag = request.notify_tag;
  n.from = from;
  n.op = static_cast<uint8_t>(request.op);
  n.segment_offset = request.remote_offset;
  n.length_bytes = request.length;
  n.grant = request.grant;
  return codec::pack(n);
}

// ------------------------------------------------------------------------------------------------
// NotificationSender
// ------------------------------------------------------------------------------------------------

void NotificationSender::send(std::vector<OutgoingNotification>& jobs) {
  std::vector<bool> grouped(jobs.size(), false);
  for (size_t first = 0; first < jobs.size(); ++first) {
    if (grouped[first]) continue;
    std::vector<size_t> left;
    for (size_t i = first; i < jobs.size(); ++i) {
      if (!grouped[i] && jobs[i].endpoints == jobs[first].endpoints) {
        grouped[i] = true;
        left.push_back(i);
      }
    }
    Status last(Code::kNoPath, "the segment publishes no endpoint for notifications");
    for (const auto& ep : jobs[first].endpoints) {
      // A pooled connection that broke mid-run is replaced once by a fresh one; a fresh one that fails
      // (or cannot be opened) moves on to the next endpoint.
      for (int attempt = 0; attempt < 2 && !left.empty(); ++attempt) {
        Conn* c = connection(ep, &last);
        if (c == nullptr) break;
        std::vector<std::string> auxes;
        for (size_t i : left) auxes.push_back(jobs[i].packed);
        std::vector<Status> replies;
        Status conn_error;
        const size_t n = tcp::control_pipeline(c->fd.get(), tcp::WireOp::kNotify, auxes, &replies, &conn_error,
                                               "notifications to " + ep);
        for (size_t k = 0; k < n; ++k) jobs[left[k]].status = replies[k];
        left.erase(left.begin(), left.begin() + static_cast<std::ptrdiff_t>(n));
        if (conn_error.is_ok()) {
          c->last_used_ns = clock_.now_ns();
          c->reused = true;
          break;
        }
        last = conn_error;
        const bool was_reused = c->reused;
        conns_.erase(ep);
        connections_broken_++;
        MC_LOG_DEBUG << "notification connection to " << ep << " broke: " << conn_error.message();
        if (!was_reused) break;
      }
      if (left.empty()) break;
    }
    for (size_t i : left) jobs[i].status = last;
  }
}

NotificationSender::Conn* NotificationSender::connection(const std::string& ep, Status* err) {
  auto it = conns_.find(ep);
  if (it != conns_.end() && tcp::idle_connection_broken(it->second.fd.get())) {
    conns_.erase(it);
    connections_broken_++;
    it = conns_.end();
  }
  if (it != conns_.end()) return &it->second;
  auto hp = parse_tcp_endpoint(ep);
  if (!hp.is_ok()) {
    *err = hp.status();
    return nullptr;
  }
  auto fd = tcp::connect_blocking(hp.value(), "", connect_timeout_ms_, connect_timeout_ms_);
  if (!fd.is_ok()) {
    *err = fd.status();
    return nullptr;
  }
  if (conns_.size() >= kMaxConnections) {
    auto lru = std::min_element(conns_.begin(), conns_.end(), [](const auto& a, const auto& b) {
      return a.second.last_used_ns < b.second.last_used_ns;
    });
    conns_.erase(lru);
  }
  connections_opened_++;
  Conn& c = conns_[ep];
  c.fd = std::move(fd).value();
  c.last_used_ns = clock_.now_ns();
  return &c;
}

void NotificationSender::evict_idle() {
  const int64_t now = clock_.now_ns();
  for (auto it = conns_.begin(); it != conns_.end();) {
    it = now - it->second.last_used_ns > idle_connection_ms_ * 1'000'000 ? conns_.erase(it) : std::next(it);
  }
}

// ------------------------------------------------------------------------------------------------
// NotificationInbox
// ------------------------------------------------------------------------------------------------

Status NotificationInbox::deliver(const std::string& packed, uint64_t grant_id) {
  MC_ASSIGN_OR_RETURN(proto::TransferNotification n,
                      codec::unpack<proto::TransferNotification>(packed, "transfer notification"));
  Notification out{n.tag, n.from, n.op == 1 ? Op::kRead : Op::kWrite, n.segment_offset, n.length_bytes, grant_id};
  std::function<void(const Notification&)> handler;
  {
    std::lock_guard<std::mutex> lk(mu_);
    handler = handler_;
    if (!handler) {
      const size_t bytes = out.tag.size() + out.from.size();
      if (queue_.size() >= kMaxQueued || queued_bytes_ + bytes > kMaxQueuedBytes) {
        return Status(Code::kResourceExhausted, "notification queue full (" + std::to_string(queue_.size()) +
                                                    " waiting, " + std::to_string(queued_bytes_) +
                                                    " bytes): this process takes none");
      }
      received_++;
      queued_bytes_ += bytes;
      queue_.push_back(std::move(out));
      cv_.notify_all();
      return Status::ok();
    }
  }
  received_++;
  handler(out);
  return Status::ok();
}

void NotificationInbox::set_handler(std::function<void(const Notification&)> handler) {
  std::lock_guard<std::mutex> lk(mu_);
  handler_ = std::move(handler);
}

std::vector<Notification> NotificationInbox::take(size_t max_count) {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<Notification> out;
  while (!queue_.empty() && out.size() < max_count) {
    queued_bytes_ -= std::min(queued_bytes_, queue_.front().tag.size() + queue_.front().from.size());
    out.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  return out;
}

Result<Notification> NotificationInbox::wait(int64_t timeout_ms) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), [&] { return !queue_.empty(); })) {
    return Status(Code::kTimeout, "no notification within " + std::to_string(timeout_ms) + " ms");
  }
  queued_bytes_ -= std::min(queued_bytes_, queue_.front().tag.size() + queue_.front().from.size());
  Notification n = std::move(queue_.front());
  queue_.pop_front();
  return n;
}

}  // namespace mc::transfer
