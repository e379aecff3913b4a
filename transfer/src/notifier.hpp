// Transfer notifications, both ends (internal to the engine; engine.hpp describes the behaviour users see).
//
//  - Initiator side: NotificationSender carries notifications to their target segments over one persistent
//    tcp control connection per target endpoint (pooled: at most kMaxConnections, the least recently used
//    closed first; idle ones closed by evict_idle). A run of notifications to one peer goes out as one send
//    and its replies are read in order, instead of a connection (handshake, thread on the target, teardown)
//    per notification. A pooled connection found broken mid-run is replaced once by a fresh one, which gets
//    the notifications not acknowledged yet (at-least-once in that case); a fresh one that fails moves on to
//    the target's next endpoint. The engine queues a request here only once every slice was acknowledged by
//    the target, so a notification never arrives before the bytes it announces.
//  - Target side: NotificationInbox takes what the engine's tcp server received, and hands each notification
//    to the handler when one is set, else queues it for take()/wait().
//
// Thread-safety: NotificationSender is used by one thread (the engine's notifier thread), except for the
// counters, which any thread may read. NotificationInbox is thread-safe; the handler runs on the server's
// connection thread that received the notification, outside the inbox's lock.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "mc/common/clock.hpp"
#include "mc/common/status.hpp"
#include "mc/proto/transfer.hpp"
#include "mc/transfer/types.hpp"
#include "tcp/net.hpp"

namespace mc::transfer {

// One notification to send and, once NotificationSender::send returns, its outcome.
struct OutgoingNotification {
  std::string packed;                  // proto::TransferNotification (pack_notification)
  std::vector<std::string> endpoints;  // the target segment's control endpoints ("tcp://host:port"), tried in order
  Status status;                       // set by send(): ok when the target acknowledged it
};

// The wire form of the notification of `request` (its notify_tag, op and remote range), sent by segment `from`
// ("" when the initiator serves no segment).
std::string pack_notification(const TransferRequest& request, const std::string& from);

class NotificationSender {
 public:
  static constexpr size_t kMaxRun = 256;         // notifications sent back to back on one connection
  static constexpr size_t kMaxConnections = 64;  // pooled peers; the least recently used goes first

  // `clock` must outlive the sender. connect_timeout_ms bounds each connect and each send or receive on a
  // connection; evict_idle() closes connections unused for more than idle_connection_ms.
  NotificationSender(const Clock& clock, int64_t connect_timeout_ms, int64_t idle_connection_ms)
      : clock_(clock), connect_timeout_ms_(connect_timeout_ms), idle_connection_ms_(idle_connection_ms) {}

  // Sends `jobs` (at most kMaxRun make one run), grouped by target (first appearance order; each group keeps
  // its order), and sets each job's status: ok, or why the target did not acknowledge it (the target's
  // refusal, or the last connection error over all its endpoints; kNoPath when it publishes none).
  void send(std::vector<OutgoingNotification>& jobs);
  // Closes the connections idle for more than idle_connection_ms.
  void evict_idle();
  // Closes every pooled connection.
  void close_all() { conns_.clear(); }

  uint64_t connections_opened() const { return connections_opened_.load(); }
  uint64_t connections_broken() const { return connections_broken_.load(); }

 private:
  struct Conn {
    tcp::Fd fd;
    int64_t last_used_ns = 0;
    bool reused = false;  // has carried a run before (so it may have gone stale since)
  };
  // The pooled connection to `ep` (opened when missing or found closed by the peer), or null with *err set.
  Conn* connection(const std::string& ep, Status* err);

  const Clock& clock_;
  const int64_t connect_timeout_ms_;
  const int64_t idle_connection_ms_;
  std::map<std::string, Conn> conns_;  // endpoint -> persistent connection
  std::atomic<uint64_t> connections_opened_{0}, connections_broken_{0};
};

class NotificationInbox {
 public:
  // Unpacks one received proto::TransferNotification and delivers it (handler, else queue), with the id of the
  // grant it carried (0: none checked). kMalformedMessage naming the notification when `packed` is not one;
  // kResourceExhausted when no handler is set and kMaxQueued notifications or kMaxQueuedBytes of tags wait
  // (a process that never takes them is not grown without bound by its peers).
  Status deliver(const std::string& packed, uint64_t grant_id = 0);
  static constexpr size_t kMaxQueued = 4096;
  static constexpr size_t kMaxQueuedBytes = 16u << 20;
  // Every later notification goes to `handler` instead of the queue (an empty function: back to the queue).
  void set_handler(std::function<void(const Notification&)> handler);
  // Up to max_count queued notifications, oldest first, removed from the queue.
  std::vector<Notification> take(size_t max_count);
  // The oldest queued notification, waiting up to timeout_ms for one; kTimeout when none came.
  Result<Notification> wait(int64_t timeout_ms);
  // Notifications delivered so far (handled or queued).
  uint64_t received() const { return received_.load(); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Notification> queue_;
  size_t queued_bytes_ = 0;  // tag + from bytes of queue_
  std::function<void(const Notification&)> handler_;
  std::atomic<uint64_t> received_{0};
};

}  // namespace mc::transfer
