// The fast RPC transport (mc/net/fast_rpc.hpp): frames split anywhere, pipelined calls answered in
// order, errors carried as Status, bad input (garbage, oversized, truncated, wrong version) answered or
// the connection closed while the server keeps serving others; a client whose server vanished fails
// with kUnavailable and stays failed (broken), never hangs or returns data.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "mc/net/fast_rpc.hpp"
#include "mc/net/rpc.hpp"
#include "mc/proto/envelope.hpp"
#include "mc/proto/store.hpp"
#include "mc/testkit/wait.hpp"

namespace mc::rpc::fast {
namespace {

TEST(FastFrames, RoundTripFedByteByByte) {
  std::string wire;
  append_frame(wire, "store.exists", 7, codec::pack(proto::StoreExistsRequest{{"a", "b"}}));
  append_frame(wire, "store.stat", 8, "");
  FrameReader r;
  std::vector<Frame> got;
  for (char c : wire) {
    r.feed(&c, 1);
    while (true) {
      auto f = r.next("test", 1 << 20);
      ASSERT_TRUE(f.is_ok()) << f.status().to_string();
      if (!f->has_value()) break;
      got.push_back(std::move(**f));
    }
  }
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].header.type, "store.exists");
  EXPECT_EQ(got[0].header.id, 7u);
  EXPECT_EQ(got[0].header.v, proto::kProtocolVersion);
  auto req = codec::unpack<proto::StoreExistsRequest>(got[0].body, "body");
  ASSERT_TRUE(req.is_ok());
  EXPECT_EQ(req->keys, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(got[1].header.id, 8u);
  EXPECT_TRUE(got[1].body.empty());
  EXPECT_EQ(r.buffered(), 0u);
}

TEST(FastFrames, LimitsAndGarbageAreErrors) {
  {
    FrameReader r;
    std::string wire;
    append_frame(wire, "x", 1, std::string(100, 'a'));
    r.feed(wire.data(), wire.size());
    auto f = r.next("peer1", 99);
    ASSERT_FALSE(f.is_ok());
    EXPECT_EQ(f.status().code(), Code::kMessageTooLarge);
    EXPECT_NE(f.status().message().find("peer1"), std::string::npos);
  }
  {
    FrameReader r;
    std::string garbage = "GET / HTTP/1.1\r\n\r\n";
    r.feed(garbage.data(), garbage.size());
    auto f = r.next("peer2", 1 << 20);
    ASSERT_FALSE(f.is_ok());
    EXPECT_EQ(f.status().code(), Code::kMalformedMessage);
  }
  {
    // A well-sized frame whose header is not msgpack.
    FrameReader r;
    std::string wire("\0\0\0\4\0\0\0\0\xc1\xc1\xc1\xc1", 12);
    r.feed(wire.data(), wire.size());
    auto f = r.next("peer3", 1 << 20);
    ASSERT_FALSE(f.is_ok());
    EXPECT_EQ(f.status().code(), Code::kMalformedMessage);
  }
}

// A server on 127.0.0.1 driven by its own thread: "echo" returns the body, anything else is kNotFound.
class FastServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = FastServer::listen(
        "tcp://127.0.0.1:0", "test-service",
        [](std::string_view type, std::string_view body, const auth::Identity*) -> Result<std::string> {
          if (type == "echo") return std::string(body);
          return Status(Code::kNotFound, "no handler for " + std::string(type));
        },
        limits());
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    server_ = std::move(s).value();
    ASSERT_NE(server_->port(), 0);
    thread_ = std::thread([this] {
      while (!stop_.load()) server_->wait_and_handle(10);
    });
  }
  void TearDown() override {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  virtual FastServerLimits limits() const { return {}; }
  std::unique_ptr<FastClient> client() {
    auto c = FastClient::connect(Endpoint::tcp("127.0.0.1", server_->port()), "test-client", 2000);
    EXPECT_TRUE(c.is_ok()) << c.status().to_string();
    return c.is_ok() ? std::move(c).value() : nullptr;
  }
  int raw_socket() {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(server_->port());
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    return fd;
  }

  std::unique_ptr<FastServer> server_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
};

TEST_F(FastServerTest, CallsErrorsAndPipelining) {
  auto c = client();
  ASSERT_TRUE(c);
  auto r = c->call_raw("echo", "hello", 2000);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r.value(), "hello");
  auto e = c->call_raw("nope", "", 2000);
  ASSERT_FALSE(e.is_ok());
  EXPECT_EQ(e.status().code(), Code::kNotFound);
  EXPECT_FALSE(c->broken());  // an error reply is an answer, not a failed connection
  // 100 requests in flight; replies come back in order with their ids and bodies.
  std::vector<uint64_t> ids;
  for (int i = 0; i < 100; ++i)
    ids.push_back(c->send("echo", std::string(1000 + i, static_cast<char>('a' + i % 26))).value());
  size_t next = 0;
  for (int spins = 0; next < ids.size() && spins < 200000; ++spins) {
    auto got = c->try_recv();
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    if (!got->has_value()) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      continue;
    }
    EXPECT_EQ((*got)->id, ids[next]);
    EXPECT_EQ((*got)->body, std::string(1000 + next, static_cast<char>('a' + next % 26)));
    ++next;
  }
  EXPECT_EQ(next, ids.size());
  // A large body (4 MiB) crosses many socket writes and reads.
  std::string big(4 << 20, 'z');
  big[12345] = 'q';
  auto b = c->call_raw("echo", big, 5000);
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_EQ(b.value(), big);
  EXPECT_EQ(server_->counters().handled, 102u);
}

TEST_F(FastServerTest, BadInputNeverStopsTheServer) {
  // Garbage: the server answers an error frame and closes that connection.
  int g = raw_socket();
  std::string garbage = "this is not a frame at all";
  ASSERT_EQ(::send(g, garbage.data(), garbage.size(), 0), static_cast<ssize_t>(garbage.size()));
  std::string back;
  char buf[4096];
  for (ssize_t n; (n = ::recv(g, buf, sizeof(buf), 0)) > 0;) back.append(buf, static_cast<size_t>(n));
  ::close(g);
  FrameReader r;
  r.feed(back.data(), back.size());
  auto f = r.next("server", 1 << 20);
  ASSERT_TRUE(f.is_ok() && f->has_value());
  EXPECT_EQ((*f)->header.type, proto::kErrorType);
  // Truncated: half a frame, then the peer goes away.
  int t = raw_socket();
  std::string wire;
  append_frame(wire, "echo", 1, "0123456789");
  ASSERT_EQ(::send(t, wire.data(), wire.size() / 2, 0), static_cast<ssize_t>(wire.size() / 2));
  ::close(t);
  // Wrong protocol version in a header: an error reply with kProtocolMismatch, connection kept.
  int v = raw_socket();
  msgpack::sbuffer head;
  msgpack::pack(head, proto::Header{proto::kProtocolVersion + 1, "echo", 5});
  std::string frame(8, '\0');
  frame[3] = static_cast<char>(head.size());
  frame.append(head.data(), head.size());
  ASSERT_EQ(::send(v, frame.data(), frame.size(), 0), static_cast<ssize_t>(frame.size()));
  FrameReader vr;
  std::optional<Frame> vf;
  for (int i = 0; i < 100 && !vf; ++i) {
    ssize_t n = ::recv(v, buf, sizeof(buf), 0);
    if (n <= 0) break;
    vr.feed(buf, static_cast<size_t>(n));
    auto x = vr.next("server", 1 << 20);
    ASSERT_TRUE(x.is_ok());
    if (x->has_value()) vf = std::move(**x);
  }
  ::close(v);
  ASSERT_TRUE(vf.has_value());
  EXPECT_EQ(vf->header.type, proto::kErrorType);
  EXPECT_EQ(vf->header.id, 5u);
  auto err = codec::unpack<proto::ErrorReply>(vf->body, "error");
  ASSERT_TRUE(err.is_ok());
  EXPECT_EQ(err->code, static_cast<uint16_t>(Code::kProtocolMismatch));
  // An oversized declared body: refused without reading (or allocating) it.
  int o = raw_socket();
  std::string huge(8, '\0');
  huge[3] = 4;
  huge[4] = 0x7f;  // body of ~2 GiB
  huge += std::string("\x83\xa1v\x01", 4);
  ASSERT_EQ(::send(o, huge.data(), huge.size(), 0), static_cast<ssize_t>(huge.size()));
  ::close(o);
  // The server still answers a good client.
  auto c = client();
  ASSERT_TRUE(c);
  auto r2 = c->call_raw("echo", "still here", 2000);
  ASSERT_TRUE(r2.is_ok()) << r2.status().to_string();
  EXPECT_EQ(r2.value(), "still here");
  EXPECT_GE(server_->counters().malformed, 2u);
}

TEST_F(FastServerTest, ServerGoneIsUnavailableNotAHang) {
  auto c = client();
  ASSERT_TRUE(c);
  stop_.store(true);
  thread_.join();
  server_.reset();  // closes every connection
  auto r = c->call_raw("echo", "x", 2000);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kUnavailable) << r.status().to_string();
  EXPECT_TRUE(c->broken());
  EXPECT_EQ(c->call_raw("echo", "x", 100).status().code(), Code::kUnavailable);
  EXPECT_EQ(FastClient::connect(Endpoint::tcp("127.0.0.1", 1), "c", 500).status().code(), Code::kUnavailable);
}

// One request/reply API, two transports: a FastServer answering with an RpcServer's handlers (dispatch)
// gives the same replies, the same unknown-type error and the same hello refusal as the ZeroMQ socket.
TEST(FastAndZmq, SameHandlersHelloAndErrors) {
  ServerOptions so;
  so.service = "twin";
  so.bind_endpoints = {"tcp://127.0.0.1:0"};
  auto zs = RpcServer::bind(so);
  ASSERT_TRUE(zs.is_ok()) << zs.status().to_string();
  RpcServer* z = zs->get();
  auto fs = FastServer::listen("tcp://127.0.0.1:0", "twin",
                               [z](std::string_view type, std::string_view body, const auth::Identity*) {
                                 return z->dispatch(type, body, CallContext{});
                               });
  ASSERT_TRUE(fs.is_ok()) << fs.status().to_string();
  FastServer* f = fs->get();
  std::atomic<bool> stop{false};
  std::thread serve([&] {
    while (!stop.load()) {
      (void)z->poll_once(2);
      f->wait_and_handle(2);
    }
  });
  auto zc = RpcClient::connect(z->endpoints().at(0));
  ASSERT_TRUE(zc.is_ok()) << zc.status().to_string();
  auto fc = FastClient::connect(Endpoint::tcp("127.0.0.1", f->port()), "twin-client", 2000);
  ASSERT_TRUE(fc.is_ok()) << fc.status().to_string();

  EXPECT_TRUE((*zc)->call(proto::PingRequest{}, 2000).is_ok());
  auto ping = (*fc)->call(proto::PingRequest{}, 2000);
  EXPECT_TRUE(ping.is_ok()) << ping.status().to_string();

  auto ze = (*zc)->call_raw("nope", "", 2000);
  auto fe = (*fc)->call_raw("nope", "", 2000);
  ASSERT_FALSE(ze.is_ok());
  EXPECT_EQ(ze.status().code(), Code::kUnimplemented);
  EXPECT_EQ(fe.status().to_string(), ze.status().to_string());

  const proto::HelloRequest old{proto::kProtocolVersion + 1, "old-client"};
  auto zh = (*zc)->call(old, 2000);
  auto fh = (*fc)->call(old, 2000);
  ASSERT_FALSE(zh.is_ok());
  EXPECT_EQ(zh.status().code(), Code::kProtocolMismatch);
  EXPECT_NE(zh.status().message().find("old-client"), std::string::npos) << zh.status().message();
  EXPECT_EQ(fh.status().to_string(), zh.status().to_string());
  EXPECT_FALSE((*fc)->broken());  // an error reply is an answer

  stop.store(true);
  serve.join();
}

}  // namespace
}  // namespace mc::rpc::fast

namespace mc::rpc::fast {
namespace {

// Small bounds (DESIGN.md §2 "Bounds"): 1 KiB frames, 1.5 KiB of partial frames in all, two connections,
// a 2 s idle timeout (long enough that a slow test thread does not see it pass between two steps).
class FastServerBoundsTest : public FastServerTest {
 protected:
  FastServerLimits limits() const override {
    FastServerLimits l;
    l.max_frame_bytes = 1024;
    l.max_buffer_bytes = 1536;
    l.max_connections = 2;
    l.idle_timeout_ms = 2000;
    return l;
  }
  // Sends the prefix and header of an "echo" frame declaring body_bytes, and `sent` bytes of its body.
  void send_partial(int fd, uint32_t body_bytes, size_t sent) {
    std::string wire;
    append_frame(wire, "echo", 9, std::string(body_bytes, 'b'));
    wire.resize(wire.size() - body_bytes + sent);
    ASSERT_EQ(::send(fd, wire.data(), wire.size(), MSG_NOSIGNAL), static_cast<ssize_t>(wire.size()));
  }
  // Reads until the server closes; the error code of its goodbye frame (0 when there is none).
  uint16_t goodbye_code(int fd) {
    std::string back;
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) back.append(buf, static_cast<size_t>(n));
    FrameReader r;
    r.feed(back.data(), back.size());
    auto f = r.next("server", 1 << 20);
    if (!f.is_ok() || !f->has_value() || (*f)->header.type != proto::kErrorType) return 0;
    auto e = codec::unpack<proto::ErrorReply>((*f)->body, "error");
    return e.is_ok() ? e->code : 0;
  }
};

TEST_F(FastServerBoundsTest, FrameOverTheLimitIsRefusedAtItsPrefix) {
  int fd = raw_socket();
  send_partial(fd, 4096, 0);
  EXPECT_EQ(goodbye_code(fd), static_cast<uint16_t>(Code::kMessageTooLarge));
  ::close(fd);
  EXPECT_EQ(server_->buffered_bytes(), 0u);
}

TEST_F(FastServerBoundsTest, PartialFramesShareOneBudget) {
  int a = raw_socket();
  send_partial(a, 1000, 10);  // admitted: about 1 KiB of the 1.5 KiB
  ASSERT_TRUE(testkit::wait_until([&] { return server_->buffered_bytes() > 0; }, 5000));
  int b = raw_socket();
  send_partial(b, 1000, 10);  // would pass the total: refused
  EXPECT_EQ(goodbye_code(b), static_cast<uint16_t>(Code::kResourceExhausted));
  ::close(b);
  EXPECT_LE(server_->buffered_bytes(), 1536u);
  // The first connection, stalled inside its frame past the idle timeout, is closed and frees its share.
  EXPECT_EQ(goodbye_code(a), 0);
  ::close(a);
  EXPECT_TRUE(testkit::wait_until([&] { return server_->buffered_bytes() == 0; }, 5000));
}

TEST_F(FastServerBoundsTest, AtTheCapAnIdleConnectionGivesWay) {
  int a = raw_socket(), b = raw_socket();  // the cap, both idle
  ASSERT_TRUE(testkit::wait_until([&] { return server_->connections() == 2; }, 5000));
  // Once they have been idle for 2 s a new client takes a slot and is served.
  auto served = [&] {
    auto c = FastClient::connect(Endpoint::tcp("127.0.0.1", server_->port()), "late", 2000);
    return c.is_ok() && (*c)->call_raw("echo", "in", 2000).is_ok();
  };
  EXPECT_TRUE(testkit::wait_until(served, 10000, 50));
  EXPECT_GE(server_->counters().evicted, 1u);
  ::close(a);
  ::close(b);
}

// Issue 51: a connection stops being answered once max_conn_buffer_bytes of replies wait unsent (here 4 KiB); the
// requests left in its buffer are answered, in order, as soon as the peer reads again: a deep pipeline of a client
// that reads loses nothing.
class FastServerBacklogTest : public FastServerTest {
 protected:
  FastServerLimits limits() const override {
    FastServerLimits l;
    l.max_conn_buffer_bytes = 4096;
    return l;
  }
};

TEST_F(FastServerBacklogTest, RequestsLeftForTheBacklogAreAnsweredWhenThePeerReads) {
  auto c = client();
  ASSERT_TRUE(c);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 300; ++i)
    ids.push_back(c->send("echo", std::string(64 << 10, static_cast<char>('a' + i % 26))).value());
  // Not read for a while: the server answers a few and leaves the rest.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  size_t next = 0;
  const int64_t until = steady_ms() + 30000;
  while (next < ids.size() && steady_ms() < until) {
    auto got = c->recv(100);
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    if (!got->has_value()) continue;
    EXPECT_EQ((*got)->id, ids[next]);
    EXPECT_EQ((*got)->body.size(), size_t{64 << 10});
    ++next;
  }
  EXPECT_EQ(next, ids.size());
  EXPECT_EQ(server_->counters().cut, 0u);
}

}  // namespace
}  // namespace mc::rpc::fast
