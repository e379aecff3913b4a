// Write-behind commit (WriteOptions::wait_commit = false, client.hpp) against a scripted master: the
// real Client over the real fast path, with a fake master whose put_end answers are chosen per key, so
// every failure is deterministic. A refused commit surfaces in flush() with its key and is counted;
// replies of several outstanding commits are matched by id (never mixed up); a bad, truncated or error
// reply fails its commit instead of crashing; a connection lost with commits outstanding reports them
// unconfirmed. (Ordering against the real master is in store_e2e_test.)
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>

#include "mc/net/fast_rpc.hpp"
#include "mc/net/rpc.hpp"
#include "mc/proto/store.hpp"
#include "mc/store/client.hpp"

namespace mc::store {
namespace {

// A master that grants every put (no replicas: nothing to write) and answers put_end by key:
// "fail/..." -> kFailedPrecondition; "garbage" -> an undecodable body; "truncated" -> half a reply;
// "error" -> an error reply (kInternal); "short" -> a reply with no codes; anything else -> ok.
// A put_start of a key starting with "pause/" pauses the fast path after answering, until resumed.
class FakeMaster {
 public:
  FakeMaster() {
    rpc::ServerOptions so;
    so.service = "fake master";
    so.bind_endpoints = {"tcp://127.0.0.1:0"};
    zmq_ = rpc::RpcServer::bind(so).value();
    auto fs = rpc::fast::FastServer::listen(
        "tcp://127.0.0.1:0", "fake master",
        [this](std::string_view type, std::string_view body, const auth::Identity*) { return dispatch(type, body); });
    fast_ = std::move(fs).value();
    zmq_->handle<proto::StoreInfoRequest>(
        [this](const proto::StoreInfoRequest&, const rpc::CallContext&) -> Result<proto::StoreInfoReply> {
          return proto::StoreInfoReply{fast_port_, "fake master", 0};
        });
    fast_port_ = fast_->port();
    thread_ = std::thread([this] { loop(); });
  }
  ~FakeMaster() {
    stop_.store(true);
    thread_.join();
  }
  std::string endpoint() const { return zmq_->endpoints().at(0); }
  // Closes the fast path (every connection) while it is paused.
  void close_fast() {
    std::lock_guard<std::mutex> lk(mu_);
    fast_.reset();
  }
  void resume() { paused_.store(false); }
  std::atomic<int> put_ends{0};

 private:
  void loop() {
    std::vector<zmq::pollitem_t> items;
    while (!stop_.load()) {
      (void)zmq_->poll_once(0);
      std::lock_guard<std::mutex> lk(mu_);
      if (!fast_ || paused_.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      fast_->wait_and_handle(5);
    }
  }
  Result<std::string> dispatch(std::string_view type, std::string_view body) {
    if (type == proto::StorePutStartRequest::kType) {
      auto req = codec::unpack<proto::StorePutStartRequest>(body, "put_start");
      if (!req.is_ok()) return req.status();
      proto::StorePutStartReply reply;
      for (const auto& k : req->keys) {
        proto::StorePutStartItem item;
        item.put_id = ++next_put_id_;
        reply.items.push_back(item);
        if (k.rfind("pause/", 0) == 0) paused_.store(true);
      }
      return codec::pack(reply);
    }
    if (type == proto::StorePutEndRequest::kType) {
      ++put_ends;
      auto req = codec::unpack<proto::StorePutEndRequest>(body, "put_end");
      if (!req.is_ok()) return req.status();
      proto::StoreItemsReply reply;
      for (const auto& k : req->keys) {
        if (k == "garbage") return std::string("\xc1\xc1\xc1", 3);
        if (k == "error") return Status(Code::kInternal, "scripted failure");
        if (k == "short") return codec::pack(proto::StoreItemsReply{});
        const bool fail = k.rfind("fail/", 0) == 0;
        reply.codes.push_back(fail ? static_cast<uint16_t>(Code::kFailedPrecondition) : 0);
        reply.messages.push_back(fail ? "put of '" + k + "' was reclaimed" : "");
        if (k == "truncated") {
          std::string full = codec::pack(reply);
          return full.substr(0, full.size() / 2);
        }
      }
      return codec::pack(reply);
    }
    if (type == proto::StoreExistsRequest::kType) {
      auto req = codec::unpack<proto::StoreExistsRequest>(body, "exists");
      if (!req.is_ok()) return req.status();
      return codec::pack(proto::StoreExistsReply{std::vector<bool>(req->keys.size(), true)});
    }
    return Status(Code::kUnimplemented, "fake master: no " + std::string(type));
  }

  std::unique_ptr<rpc::RpcServer> zmq_;
  std::mutex mu_;
  std::unique_ptr<rpc::fast::FastServer> fast_;
  uint32_t fast_port_ = 0;
  uint64_t next_put_id_ = 0;
  std::atomic<bool> stop_{false}, paused_{false};
  std::thread thread_;
};

std::unique_ptr<Client> connect(const FakeMaster& m) {
  ClientOptions o;
  o.master = m.endpoint();
  o.client_id = "commit-test";
  o.heartbeat_ms = 0;
  o.rpc_timeout_ms = 2000;
  auto c = Client::connect(o);
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  return c.is_ok() ? std::move(c).value() : nullptr;
}

const WriteOptions kBehind{false, false, false, 0};

TEST(WriteBehindCommit, RefusedCommitSurfacesInFlushWithItsKey) {
  FakeMaster m;
  auto c = connect(m);
  ASSERT_TRUE(c);
  std::vector<std::byte> data(64, std::byte{7});
  EXPECT_TRUE(c->put("ok/1", data, kBehind).is_ok());
  EXPECT_TRUE(c->put("fail/2", data, kBehind).is_ok());  // returns before the master's answer
  std::vector<PutItem> batch = {{"ok/3", data}, {"fail/4", data}, {"ok/5", data}};
  auto st = c->batch_put(batch, kBehind);
  ASSERT_TRUE(st.is_ok()) << st.status().to_string();
  for (const Status& s : *st) EXPECT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(c->counters().commits_behind, 5u);
  std::vector<CommitFailure> failed;
  Status f = c->flush(&failed);
  EXPECT_EQ(f.code(), Code::kFailedPrecondition) << f.to_string();
  EXPECT_NE(f.message().find("fail/2"), std::string::npos) << f.message();
  EXPECT_NE(f.message().find("2 write-behind"), std::string::npos) << f.message();
  ASSERT_EQ(failed.size(), 2u);
  EXPECT_EQ(failed[0].key, "fail/2");
  EXPECT_EQ(failed[1].key, "fail/4");
  EXPECT_EQ(failed[1].status.code(), Code::kFailedPrecondition);
  EXPECT_EQ(c->counters().commit_failures, 2u);
  EXPECT_EQ(c->commits_pending(), 0u);
  // Reported once: the next flush has nothing to say.
  EXPECT_TRUE(c->flush().is_ok());
  // wait_commit (the default) returns the refusal from put itself.
  EXPECT_EQ(c->put("fail/6", data).code(), Code::kFailedPrecondition);
  EXPECT_EQ(m.put_ends.load(), 4);
}

TEST(WriteBehindCommit, ManyOutstandingRepliesAreMatchedByIdAndCollectedByTheNextCall) {
  FakeMaster m;
  auto c = connect(m);
  ASSERT_TRUE(c);
  std::vector<std::byte> data(64, std::byte{1});
  std::set<std::string> expect_failed;
  for (int i = 0; i < 60; ++i) {
    std::string key = (i % 3 == 1 ? "fail/" : "ok/") + std::to_string(i);
    if (i % 3 == 1) expect_failed.insert(key);
    ASSERT_TRUE(c->put(key, data, kBehind).is_ok());
  }
  // Each put's put_start call already read the replies of the commits before it; the last commit's reply
  // is read by the next call on the connection (its own reply comes after it).
  EXPECT_LE(c->commits_pending(), 1u);
  auto e = c->exists({"x"});
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  EXPECT_EQ(c->commits_pending(), 0u);
  EXPECT_EQ(c->counters().commit_failures, expect_failed.size());
  std::vector<CommitFailure> failed;
  EXPECT_FALSE(c->flush(&failed).is_ok());
  std::set<std::string> got;
  for (const auto& f : failed) got.insert(f.key);
  EXPECT_EQ(got, expect_failed);
}

TEST(WriteBehindCommit, BadTruncatedOrErrorRepliesFailTheirCommitNotTheClient) {
  FakeMaster m;
  auto c = connect(m);
  ASSERT_TRUE(c);
  std::vector<std::byte> data(64, std::byte{2});
  for (const char* k : {"garbage", "truncated", "error", "short"}) EXPECT_TRUE(c->put(k, data, kBehind).is_ok()) << k;
  std::vector<CommitFailure> failed;
  EXPECT_FALSE(c->flush(&failed).is_ok());
  ASSERT_EQ(failed.size(), 4u);
  EXPECT_EQ(failed[0].key, "garbage");
  EXPECT_EQ(failed[0].status.code(), Code::kMalformedMessage) << failed[0].status.to_string();
  EXPECT_EQ(failed[1].key, "truncated");
  EXPECT_EQ(failed[1].status.code(), Code::kMalformedMessage) << failed[1].status.to_string();
  EXPECT_EQ(failed[2].key, "error");
  EXPECT_EQ(failed[2].status.code(), Code::kInternal);
  EXPECT_EQ(failed[3].key, "short");
  EXPECT_EQ(failed[3].status.code(), Code::kMalformedMessage);
  // The connection is intact: later write-behind puts commit normally.
  EXPECT_TRUE(c->put("ok/after", data, kBehind).is_ok());
  EXPECT_TRUE(c->flush().is_ok());
  EXPECT_EQ(c->counters().master_calls_zmq, 0u);
}

TEST(WriteBehindCommit, LostConnectionReportsOutstandingCommitsUnconfirmed) {
  FakeMaster m;
  auto c = connect(m);
  ASSERT_TRUE(c);
  std::vector<std::byte> data(64, std::byte{3});
  // The fake pauses after granting this put: its put_end stays unanswered, then the fast path closes.
  ASSERT_TRUE(c->put("pause/1", data, kBehind).is_ok());
  EXPECT_EQ(c->commits_pending(), 1u);
  m.close_fast();
  std::vector<CommitFailure> failed;
  Status f = c->flush(&failed);
  EXPECT_EQ(f.code(), Code::kUnavailable) << f.to_string();
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].key, "pause/1");
  EXPECT_NE(failed[0].status.message().find("unconfirmed"), std::string::npos) << failed[0].status.to_string();
  EXPECT_EQ(c->commits_pending(), 0u);
}

}  // namespace
}  // namespace mc::store
