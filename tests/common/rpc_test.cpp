#include "mc/net/rpc.hpp"
#include "mc/proto/envelope.hpp"
#include "mc/proto/kv_events.hpp"

#include <gtest/gtest.h>

#include <thread>

namespace mc::rpc {
namespace {

struct EchoReply {
  std::string text;
  int64_t size_bytes = 0;
  MC_MESSAGE(text, size_bytes);
};
struct EchoRequest {
  static constexpr const char* kType = "test.echo";
  using Reply = EchoReply;
  std::string text;
  MC_MESSAGE(text);
};

class RpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions opt;
    opt.service = "test-server";
    opt.bind_endpoints = {"tcp://127.0.0.1:0"};
    opt.max_message_bytes = 1 << 20;
    auto s = RpcServer::bind(opt);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    server_ = std::move(s).value();
    server_->handle<EchoRequest>([](const EchoRequest& req, const CallContext&) -> Result<EchoReply> {
      if (req.text == "fail") return Status(Code::kObjectNotFound, "key 'fail' not found on test-server");
      return EchoReply{req.text, static_cast<int64_t>(req.text.size())};
    });
    endpoint_ = server_->endpoints().at(0);
    thread_ = std::thread([this] { (void)server_->serve(); });
  }
  void TearDown() override {
    server_->stop();
    thread_.join();
  }

  // Sends raw frames from a bare DEALER and returns the reply frames (empty on timeout).
  std::vector<std::string> raw_call(const std::vector<std::string>& frames, int timeout_ms = 1000) {
    zmq::socket_t s(context(), zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    s.connect(endpoint_);
    for (size_t i = 0; i < frames.size(); ++i) {
      s.send(zmq::buffer(frames[i]), i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
    zmq::pollitem_t items[] = {{s.handle(), 0, ZMQ_POLLIN, 0}};
    zmq::poll(items, 1, std::chrono::milliseconds(timeout_ms));
    std::vector<std::string> out;
    if (!(items[0].revents & ZMQ_POLLIN)) return out;
    std::vector<zmq::message_t> msgs;
    (void)zmq::recv_multipart(s, std::back_inserter(msgs));
    for (auto& m : msgs) out.push_back(m.to_string());
    return out;
  }

  Status error_of(const std::vector<std::string>& reply) {
    if (reply.size() != 2) return Status(Code::kInternal, "no reply");
    auto h = codec::unpack<proto::Header>(reply[0], "h");
    if (!h.is_ok() || h->type != proto::kErrorType) return Status(Code::kInternal, "not an error reply");
    auto e = codec::unpack<proto::ErrorReply>(reply[1], "e");
    return Status(static_cast<Code>(e->code), e->message);
  }

  void expect_still_serving() {
    auto c = RpcClient::connect(endpoint_);
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    auto r = (*c)->call(EchoRequest{"alive"}, 2000);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->text, "alive");
  }

  std::unique_ptr<RpcServer> server_;
  std::string endpoint_;
  std::thread thread_;
};

TEST_F(RpcTest, CallAndErrorReply) {
  auto c = RpcClient::connect(endpoint_, ClientOptions{"tester"});
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ((*c)->server_hello().service, "test-server");
  auto r = (*c)->call(EchoRequest{"hello"});
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->text, "hello");
  EXPECT_EQ(r->size_bytes, 5);
  auto err = (*c)->call(EchoRequest{"fail"});
  ASSERT_FALSE(err.is_ok());
  EXPECT_EQ(err.status().code(), Code::kObjectNotFound);
  EXPECT_NE(err.status().message().find("'fail'"), std::string::npos);
  auto ping = (*c)->call(proto::PingRequest{});
  ASSERT_TRUE(ping.is_ok());
  EXPECT_GT(ping->server_unix_ms, 0);
}

TEST_F(RpcTest, UnknownTypeIsAnError) {
  auto c = RpcClient::connect(endpoint_);
  ASSERT_TRUE(c.is_ok());
  auto r = (*c)->call_raw("no.such.type", codec::pack(proto::PingRequest{}));
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kUnimplemented);
  EXPECT_NE(r.status().message().find("no.such.type"), std::string::npos);
}

TEST_F(RpcTest, ProtocolMismatchOnConnectAndPerMessage) {
  auto hello = raw_call({codec::pack(proto::Header{proto::kProtocolVersion, "hello", 1}),
                         codec::pack(proto::HelloRequest{proto::kProtocolVersion + 1, "future-client"})});
  Status s = error_of(hello);
  EXPECT_EQ(s.code(), Code::kProtocolMismatch);
  EXPECT_NE(s.message().find("future-client"), std::string::npos);
  auto msg = raw_call(
      {codec::pack(proto::Header{proto::kProtocolVersion + 1, "test.echo", 2}), codec::pack(EchoRequest{"x"})});
  EXPECT_EQ(error_of(msg).code(), Code::kProtocolMismatch);
  expect_still_serving();
}

TEST_F(RpcTest, TruncatedIllTypedAndMissingFrames) {
  std::string body = codec::pack(EchoRequest{"some text"});
  auto truncated =
      raw_call({codec::pack(proto::Header{proto::kProtocolVersion, "test.echo", 3}), body.substr(0, body.size() / 2)});
  Status s = error_of(truncated);
  EXPECT_EQ(s.code(), Code::kMalformedMessage);
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.message();
  auto ill = raw_call({codec::pack(proto::Header{proto::kProtocolVersion, "test.echo", 4}),
                       codec::pack(std::map<std::string, int>{{"text", 5}})});
  EXPECT_EQ(error_of(ill).code(), Code::kMalformedMessage);
  auto one_frame = raw_call({codec::pack(proto::Header{proto::kProtocolVersion, "test.echo", 5})});
  EXPECT_EQ(error_of(one_frame).code(), Code::kMalformedMessage);
  // Unreadable header: dropped with a log line, no reply.
  auto junk = raw_call({"\xc1\xc1\xc1", body}, 300);
  EXPECT_TRUE(junk.empty());
  expect_still_serving();
}

TEST_F(RpcTest, OversizedMessageIsDroppedAndServerSurvives) {
  std::string big(2 << 20, 'x');  // over the 1 MiB limit of this server
  auto r = raw_call(
      {codec::pack(proto::Header{proto::kProtocolVersion, "test.echo", 6}), codec::pack(EchoRequest{big})}, 500);
  EXPECT_TRUE(r.empty());
  expect_still_serving();
}

TEST(Rpc, TimeoutNamesEndpoint) {
  // Nothing listens here: connect fails within its timeout with a clear message.
  ClientOptions opt;
  opt.connect_timeout_ms = 200;
  auto c = RpcClient::connect("tcp://127.0.0.1:1", opt);
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), Code::kUnavailable);
  EXPECT_NE(c.status().message().find("tcp://127.0.0.1:1"), std::string::npos);
  auto bad = RpcClient::connect("nonsense-endpoint", opt);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
}

TEST(Rpc, BindFailureNamesEndpoint) {
  ServerOptions opt;
  opt.service = "svc";
  opt.bind_endpoints = {"tcp://127.0.0.1:0"};
  auto a = RpcServer::bind(opt);
  ASSERT_TRUE(a.is_ok());
  opt.bind_endpoints = {(*a)->endpoints()[0]};
  auto b = RpcServer::bind(opt);
  ASSERT_FALSE(b.is_ok());
  EXPECT_NE(b.status().message().find((*a)->endpoints()[0]), std::string::npos);
}

// Listening and subscribing go through the one endpoint grammar: ZeroMQ itself would take port 65537 as 1 and
// 99999 as a free port, and accept 'tcp://[::1' to subscribe to nothing.
TEST(Rpc, BadEndpointsAreRefusedBeforeZeroMq) {
  ServerOptions opt;
  opt.service = "svc";
  for (const char* bad : {"tcp://127.0.0.1:65537", "tcp://127.0.0.1:99999", "tcp://[::1", "udp://127.0.0.1:1"}) {
    opt.bind_endpoints = {bad};
    auto s = RpcServer::bind(opt);
    ASSERT_FALSE(s.is_ok()) << bad;
    EXPECT_EQ(s.status().code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(s.status().message().find(bad), std::string::npos) << s.status().message();
    auto pub = EventPublisher::bind(bad, "kv");
    EXPECT_EQ(pub.status().code(), Code::kInvalidArgument) << bad;
    auto sub = EventSubscriber::connect(bad, "kv");
    EXPECT_EQ(sub.status().code(), Code::kInvalidArgument) << bad;
  }
}

TEST(Rpc, DeferredReplyAndPush) {
  ServerOptions opt;
  opt.bind_endpoints = {"tcp://127.0.0.1:0"};
  auto s = RpcServer::bind(opt);
  ASSERT_TRUE(s.is_ok());
  RpcServer& server = **s;
  std::optional<CallContext> pending;
  server.handle<EchoRequest>([&](const EchoRequest&, const CallContext& ctx) -> Result<EchoReply> {
    ctx.defer();
    pending = ctx;
    return EchoReply{};
  });
  std::thread t([&] {
    for (int i = 0; i < 200 && !server.stopped(); ++i) {
      (void)server.poll_once(10);
      if (pending) {
        EXPECT_TRUE(server.push_to(pending->peer, proto::StatRequest{}).is_ok());
        EXPECT_TRUE(server.reply_to(*pending, EchoReply{"later", 5}).is_ok());
        pending.reset();
      }
    }
  });
  auto c = RpcClient::connect(server.endpoints()[0]);
  ASSERT_TRUE(c.is_ok());
  auto r = (*c)->call(EchoRequest{"x"}, 2000);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->text, "later");
  auto pushed = (*c)->recv_push(1000);
  ASSERT_TRUE(pushed.is_ok());
  ASSERT_TRUE(pushed->has_value());
  EXPECT_EQ((*pushed)->header.type, "stat");
  server.stop();
  t.join();
}

TEST(Rpc, KvEventsHaveConsecutiveIds) {
  auto pub = EventPublisher::bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(pub.is_ok());
  auto sub = EventSubscriber::connect((*pub)->endpoint());
  ASSERT_TRUE(sub.is_ok());
  // PUB/SUB joins asynchronously: publish until the subscriber sees something (bounded).
  std::vector<proto::KvEvent> got;
  for (int i = 0; i < 200 && got.size() < 3; ++i) {
    ASSERT_TRUE((*pub)->publish(proto::KvEvent{proto::kKvEventStored, 0, 0, {uint64_t(i)}, "seg", "cpu"}).is_ok());
    auto ev = (*sub)->next(10);
    ASSERT_TRUE(ev.is_ok());
    if (ev->has_value()) got.push_back(**ev);
  }
  ASSERT_GE(got.size(), 2u);
  for (size_t i = 1; i < got.size(); ++i) EXPECT_EQ(got[i].event_id, got[i - 1].event_id + 1);
  EXPECT_EQ(got[0].seq_hashes[0] + 1, got[0].event_id);
}

}  // namespace
}  // namespace mc::rpc
