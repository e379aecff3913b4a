// rpc::AsyncClient, the one RPC client (rpc.hpp): pipelining, out-of-order replies, timeouts and late
// replies, the in-flight bound, reconnect after a timeout, forget(), many endpoints, a hello of another
// protocol version, bad and unreachable endpoints, the connection watch.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <mutex>
#include <thread>

#include "mc/net/rpc.hpp"
#include "mc/proto/envelope.hpp"
#include "mc/testkit/wait.hpp"

namespace mc::rpc {
namespace {

struct AsyncEchoReply {
  std::string text;
  MC_MESSAGE(text);
};
struct AsyncEchoRequest {
  static constexpr const char* kType = "test.echo";
  using Reply = AsyncEchoReply;
  std::string text;
  MC_MESSAGE(text);
};

// An RpcServer on its own thread whose echo handler holds every request until the test answers it
// (CallContext::defer): the test decides the order and the time of each reply.
class HoldingServer {
 public:
  struct Held {
    CallContext ctx;
    std::string text;
  };

  HoldingServer() {
    ServerOptions opt;
    opt.service = "holding-server";
    opt.bind_endpoints = {"tcp://127.0.0.1:0"};
    auto s = RpcServer::bind(opt);
    EXPECT_TRUE(s.is_ok()) << s.status().to_string();
    server_ = std::move(s).value();
    server_->handle<AsyncEchoRequest>(
        [this](const AsyncEchoRequest& req, const CallContext& ctx) -> Result<AsyncEchoReply> {
          ctx.defer();
          std::lock_guard<std::mutex> lock(mu_);
          held_.push_back(Held{ctx, req.text});
          return AsyncEchoReply{};
        });
    thread_ = std::thread([this] {
      while (!server_->stopped()) {
        (void)server_->poll_once(5);
        std::vector<std::packaged_task<void()>> tasks;
        {
          std::lock_guard<std::mutex> lock(mu_);
          tasks.swap(tasks_);
        }
        for (auto& t : tasks) t();
      }
    });
  }
  ~HoldingServer() {
    server_->stop();
    thread_.join();
  }

  const std::string& endpoint() const { return server_->endpoints().at(0); }

  size_t held() {
    std::lock_guard<std::mutex> lock(mu_);
    return held_.size();
  }

  // Answers every held request with its own text (on the server's thread), newest or oldest first.
  void answer_all(bool newest_first = true) {
    run_on_server([this, newest_first] {
      std::vector<Held> held;
      {
        std::lock_guard<std::mutex> lock(mu_);
        held.swap(held_);
      }
      if (newest_first) std::reverse(held.begin(), held.end());
      for (const Held& h : held) EXPECT_TRUE(server_->reply_to(h.ctx, AsyncEchoReply{h.text}).is_ok());
    });
  }

 private:
  void run_on_server(std::function<void()> fn) {
    std::packaged_task<void()> task(std::move(fn));
    std::future<void> done = task.get_future();
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    done.get();
  }

  std::unique_ptr<RpcServer> server_;
  std::thread thread_;
  std::mutex mu_;
  std::vector<Held> held_;
  std::vector<std::packaged_task<void()>> tasks_;
};

// Polls `client` until `done()` or 5 s pass.
template <typename Done>
bool poll_until(AsyncClient& client, Done done) {
  return testkit::wait_until(
      [&] {
        client.poll(5);
        return done();
      },
      5000, 0);
}

TEST(AsyncClient, PipelinesCallsAndMatchesRepliesInAnyOrder) {
  HoldingServer server;
  AsyncClient client;
  ASSERT_TRUE(client.connect(server.endpoint(), 2000).is_ok());
  ASSERT_NE(client.server_hello(server.endpoint()), nullptr);
  EXPECT_EQ(client.server_hello(server.endpoint())->service, "holding-server");
  constexpr int kCalls = 32;
  std::vector<std::string> got(kCalls);
  int done = 0;
  for (int i = 0; i < kCalls; ++i) {
    client.call(server.endpoint(), AsyncEchoRequest{"call-" + std::to_string(i)}, 5000,
                [&got, &done, i](Result<AsyncEchoReply> r) {
                  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
                  got[i] = r->text;
                  ++done;
                });
  }
  // All of them reach the server before any reply comes back: they are in flight together.
  EXPECT_EQ(client.in_flight(server.endpoint()), static_cast<size_t>(kCalls));
  ASSERT_TRUE(testkit::wait_until([&] { return server.held() == kCalls; }, 5000));
  server.answer_all();
  ASSERT_TRUE(poll_until(client, [&] { return done == kCalls; }));
  for (int i = 0; i < kCalls; ++i) EXPECT_EQ(got[i], "call-" + std::to_string(i));
  EXPECT_EQ(client.in_flight(), 0U);
  EXPECT_EQ(client.counters().replies, static_cast<uint64_t>(kCalls + 1));  // and the hello
}

// abandon_wait (a daemon's second stop signal): a blocking call to a server that holds it ends with kCancelled
// within about 100 ms of the predicate turning true, long before its timeout, and the endpoint's socket is closed;
// a connect to an address where nothing answers ends the same way.
TEST(AsyncClient, AbandonWaitEndsABlockingCallAndAConnect) {
  HoldingServer server;
  std::atomic<bool> stop_now{false};
  AsyncClientOptions options;
  options.abandon_wait = [&stop_now] { return stop_now.load(); };
  AsyncClient client(options);
  ASSERT_TRUE(client.connect(server.endpoint(), 2000).is_ok());
  std::thread signal([&] {
    (void)testkit::wait_until([&] { return server.held() == 1; }, 5000);
    stop_now = true;
  });
  const int64_t start_ms = steady_ms();
  auto r = client.call_sync(server.endpoint(), AsyncEchoRequest{"held"}, 30000);
  const int64_t waited_ms = steady_ms() - start_ms;
  signal.join();
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kCancelled) << r.status().to_string();
  EXPECT_LT(waited_ms, 20000) << "the call waited for its timeout";
  EXPECT_EQ(client.in_flight(), 0U);
  EXPECT_EQ(client.server_hello(server.endpoint()), nullptr);  // the socket was closed
  // A connect to a port where nothing listens gives up at once too (its timeout is 30 s).
  Status c = client.connect("tcp://127.0.0.1:1", 30000);
  EXPECT_EQ(c.code(), Code::kCancelled) << c.to_string();
  // Empty: a blocking call is never abandoned (the held call is answered, then the reply comes). Another server:
  // the first one still holds the abandoned call, whose caller is gone.
  HoldingServer other;
  AsyncClientOptions never;
  never.abandon_wait = nullptr;
  AsyncClient patient(never);
  stop_now = true;
  std::thread answer([&] {
    (void)testkit::wait_until([&] { return other.held() == 1; }, 5000);
    other.answer_all();
  });
  auto ok = patient.call_sync(other.endpoint(), AsyncEchoRequest{"answered"}, 10000);
  answer.join();
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ(ok->text, "answered");
}

TEST(AsyncClient, TimeoutLateReplyAndReconnect) {
  HoldingServer server;
  AsyncClient client;
  ASSERT_TRUE(client.connect(server.endpoint(), 2000).is_ok());
  std::optional<Result<AsyncEchoReply>> quick, patient;
  client.call(server.endpoint(), AsyncEchoRequest{"quick"}, 50,
              [&](Result<AsyncEchoReply> r) { quick = std::move(r); });
  client.call(server.endpoint(), AsyncEchoRequest{"patient"}, 5000,
              [&](Result<AsyncEchoReply> r) { patient = std::move(r); });
  ASSERT_TRUE(poll_until(client, [&] { return quick.has_value(); }));
  ASSERT_FALSE(quick->is_ok());
  EXPECT_EQ(quick->status().code(), Code::kTimeout);
  EXPECT_NE(quick->status().message().find("test.echo"), std::string::npos) << quick->status().message();
  EXPECT_NE(quick->status().message().find(server.endpoint()), std::string::npos);
  EXPECT_FALSE(patient.has_value());
  // The other call keeps the socket open; both replies come (the late one first), the late one is dropped
  // by its id.
  ASSERT_TRUE(testkit::wait_until([&] { return server.held() == 2; }, 5000));
  server.answer_all(/*newest_first=*/false);
  ASSERT_TRUE(poll_until(client, [&] { return patient.has_value(); }));
  ASSERT_TRUE(patient->is_ok()) << patient->status().to_string();
  EXPECT_EQ((*patient)->text, "patient");
  ASSERT_TRUE(poll_until(client, [&] { return client.counters().late_replies == 1; }));
  // Nothing is in flight any more: the socket that saw a timeout is closed, and the next call opens a
  // fresh one (with a fresh hello) that works.
  EXPECT_EQ(client.counters().reconnects, 1U);
  EXPECT_EQ(client.server_hello(server.endpoint()), nullptr);
  std::optional<Result<AsyncEchoReply>> again;
  client.call(server.endpoint(), AsyncEchoRequest{"again"}, 5000,
              [&](Result<AsyncEchoReply> r) { again = std::move(r); });
  ASSERT_TRUE(testkit::wait_until([&] { return server.held() == 1; }, 5000));
  server.answer_all();
  ASSERT_TRUE(poll_until(client, [&] { return again.has_value(); }));
  ASSERT_TRUE(again->is_ok()) << again->status().to_string();
  EXPECT_NE(client.server_hello(server.endpoint()), nullptr);
}

TEST(AsyncClient, BoundsCallsInFlightPerEndpoint) {
  HoldingServer server;
  AsyncClientOptions opt;
  opt.max_in_flight_per_endpoint = 4;
  AsyncClient client(opt);
  ASSERT_TRUE(client.connect(server.endpoint(), 2000).is_ok());
  int ok = 0;
  std::optional<Status> refused;
  for (int i = 0; i < 5; ++i) {
    client.call(server.endpoint(), AsyncEchoRequest{"x"}, 5000, [&](Result<AsyncEchoReply> r) {
      if (r.is_ok()) {
        ++ok;
      } else {
        refused = r.status();
      }
    });
  }
  EXPECT_EQ(client.in_flight(server.endpoint()), 4U);
  client.poll(0);  // the refusal is delivered by poll, never inside call()
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->code(), Code::kResourceExhausted);
  EXPECT_NE(refused->message().find("limit 4"), std::string::npos) << refused->message();
  ASSERT_TRUE(testkit::wait_until([&] { return server.held() == 4; }, 5000));
  server.answer_all();
  ASSERT_TRUE(poll_until(client, [&] { return ok == 4; }));
}

TEST(AsyncClient, ForgetFailsCallsInFlightAndManyEndpointsArePolledTogether) {
  HoldingServer a, b;
  AsyncClient client;
  std::optional<Result<AsyncEchoReply>> ra, rb;
  client.call(a.endpoint(), AsyncEchoRequest{"to-a"}, 5000, [&](Result<AsyncEchoReply> r) { ra = std::move(r); });
  client.call(b.endpoint(), AsyncEchoRequest{"to-b"}, 5000, [&](Result<AsyncEchoReply> r) { rb = std::move(r); });
  ASSERT_TRUE(testkit::wait_until([&] { return a.held() == 1 && b.held() == 1; }, 5000));
  client.forget(a.endpoint());
  EXPECT_FALSE(ra.has_value());  // callbacks run in poll(), not inside forget()
  b.answer_all();
  ASSERT_TRUE(poll_until(client, [&] { return ra.has_value() && rb.has_value(); }));
  ASSERT_FALSE(ra->is_ok());
  EXPECT_EQ(ra->status().code(), Code::kCancelled);
  ASSERT_TRUE(rb->is_ok()) << rb->status().to_string();
  EXPECT_EQ((*rb)->text, "to-b");
}

// watch(): a server that goes away (its socket closed, as a killed process's kernel does) is reported once, by
// endpoint; a live server that is only slow to answer is not; unwatched endpoints are never reported.
TEST(AsyncClient, WatchReportsALostConnectionOnce) {
  AsyncClient client;
  auto a = std::make_unique<HoldingServer>();
  HoldingServer b;
  const std::string gone = a->endpoint();
  client.watch(gone);
  client.watch(b.endpoint());
  // Both connections are up once their hellos are answered; a call held by b (slow) is not a loss.
  ASSERT_TRUE(poll_until(
      client, [&] { return client.server_hello(gone) != nullptr && client.server_hello(b.endpoint()) != nullptr; }));
  std::optional<Result<AsyncEchoReply>> held;
  client.call(b.endpoint(), AsyncEchoRequest{"slow"}, 60'000, [&](Result<AsyncEchoReply> r) { held = std::move(r); });
  ASSERT_TRUE(testkit::wait_until([&] { return b.held() == 1; }, 5000));
  EXPECT_TRUE(client.take_disconnected().empty());
  a.reset();  // the server's socket closes
  std::vector<std::string> lost;
  ASSERT_TRUE(poll_until(client, [&] {
    for (std::string& e : client.take_disconnected()) lost.push_back(std::move(e));
    return !lost.empty();
  }));
  EXPECT_EQ(lost, std::vector<std::string>{gone});
  EXPECT_EQ(client.counters().disconnects, 1u);
  // Unwatched, an endpoint is not watched again; a bad endpoint is refused (logged) without watching anything.
  client.unwatch(gone);
  client.watch("not-an-endpoint");
  b.answer_all();
  ASSERT_TRUE(poll_until(client, [&] { return held.has_value(); }));
  ASSERT_TRUE(held->is_ok()) << held->status().to_string();
  EXPECT_TRUE(client.take_disconnected().empty());
}

TEST(AsyncClient, ErrorRepliesKeepTheServersCodeAndBadEndpointsAreRefused) {
  ServerOptions so;
  so.service = "svc";
  so.bind_endpoints = {"tcp://127.0.0.1:0"};
  auto s = RpcServer::bind(so);
  ASSERT_TRUE(s.is_ok());
  std::thread t([&] { (void)(*s)->serve(); });
  AsyncClient client;
  auto r = client.call_raw_sync((*s)->endpoints()[0], "no.such.type", codec::pack(proto::PingRequest{}), 2000);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kUnimplemented);
  auto bad = client.call_sync("nonsense-endpoint", AsyncEchoRequest{"x"}, 1000);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("nonsense-endpoint"), std::string::npos);
  Status none = client.connect("tcp://127.0.0.1:1", 100);
  EXPECT_EQ(none.code(), Code::kUnavailable);
  EXPECT_NE(none.message().find("tcp://127.0.0.1:1"), std::string::npos);
  (*s)->stop();
  t.join();
}

TEST(AsyncClient, HelloOfAnotherVersionFailsTheEndpoint) {
  // A bare ROUTER answering every message with a protocol-mismatch error, as a server of another version does.
  zmq::socket_t router(context(), zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.bind("tcp://127.0.0.1:0");
  const std::string endpoint = router.get(zmq::sockopt::last_endpoint);
  std::atomic<bool> stop{false};
  std::thread t([&] {
    while (!stop) {
      zmq::pollitem_t items[] = {{router.handle(), 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, 1, std::chrono::milliseconds(5));
      if (!(items[0].revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> frames;
      if (!zmq::recv_multipart(router, std::back_inserter(frames))) continue;
      auto h = codec::unpack<proto::Header>(frames.at(1).to_string_view(), "h");
      if (!h.is_ok()) continue;
      std::string head = codec::pack(proto::Header{proto::kProtocolVersion, proto::kErrorType, h->id});
      std::string body = error_reply_body(Status(Code::kProtocolMismatch, "old-server speaks another version"));
      router.send(zmq::buffer(frames[0].to_string()), zmq::send_flags::sndmore);
      router.send(zmq::buffer(head), zmq::send_flags::sndmore);
      router.send(zmq::buffer(body), zmq::send_flags::none);
    }
  });
  AsyncClient client;
  Status s = client.connect(endpoint, 2000);
  EXPECT_EQ(s.code(), Code::kProtocolMismatch) << s.to_string();
  EXPECT_NE(s.message().find("another version"), std::string::npos) << s.message();
  stop = true;
  t.join();
}

}  // namespace
}  // namespace mc::rpc
