#include "mc/common/endpoint.hpp"

#include <gtest/gtest.h>

namespace mc {
namespace {

TEST(Endpoint, ParsesIpv4AndNames) {
  Result<Endpoint> ep = parse_endpoint("tcp://127.0.0.1:7450");
  ASSERT_TRUE(ep.is_ok()) << ep.status().to_string();
  EXPECT_EQ(ep->kind, Endpoint::Kind::kTcp);
  EXPECT_EQ(ep->host, "127.0.0.1");
  EXPECT_EQ(ep->port, 7450);
  EXPECT_EQ(ep->str(), "tcp://127.0.0.1:7450");
  EXPECT_EQ(ep->host_port(), "127.0.0.1:7450");

  ep = parse_endpoint("tcp://node-a:65535");
  ASSERT_TRUE(ep.is_ok()) << ep.status().to_string();
  EXPECT_EQ(ep->host, "node-a");
  EXPECT_EQ(ep->port, 65535);

  ep = parse_endpoint("tcp://*:5555");
  ASSERT_TRUE(ep.is_ok()) << ep.status().to_string();
  EXPECT_EQ(ep->host, "*");
}

TEST(Endpoint, ParsesIpv6InBrackets) {
  Result<Endpoint> ep = parse_endpoint("tcp://[::1]:4000");
  ASSERT_TRUE(ep.is_ok()) << ep.status().to_string();
  EXPECT_EQ(ep->host, "::1");
  EXPECT_EQ(ep->port, 4000);
  EXPECT_EQ(ep->str(), "tcp://[::1]:4000");
  EXPECT_EQ(format_host_port("fe80::1", 9), "[fe80::1]:9");
  EXPECT_EQ(Endpoint::tcp("::1", 0).str(), "tcp://[::1]:0");
}

TEST(Endpoint, PortZeroMeansAnyFreePort) {
  Result<Endpoint> ep = parse_endpoint("tcp://127.0.0.1:0");
  ASSERT_TRUE(ep.is_ok()) << ep.status().to_string();
  EXPECT_EQ(ep->port, 0);
  EXPECT_EQ(ep->str(), "tcp://127.0.0.1:0");
}

TEST(Endpoint, ParsesIpc) {
  Result<Endpoint> ep = parse_endpoint("ipc:///tmp/mc.sock");
  ASSERT_TRUE(ep.is_ok()) << ep.status().to_string();
  EXPECT_EQ(ep->kind, Endpoint::Kind::kIpc);
  EXPECT_FALSE(ep->is_tcp());
  EXPECT_EQ(ep->path, "/tmp/mc.sock");
  EXPECT_EQ(ep->str(), "ipc:///tmp/mc.sock");
  EXPECT_EQ(*ep, Endpoint::ipc("/tmp/mc.sock"));
}

TEST(Endpoint, TcpParserTakesBareHostPortOnly) {
  Result<Endpoint> ep = parse_tcp_endpoint("10.0.0.2:17000");
  ASSERT_TRUE(ep.is_ok()) << ep.status().to_string();
  EXPECT_EQ(*ep, Endpoint::tcp("10.0.0.2", 17000));
  ep = parse_tcp_endpoint("[::1]:5");
  ASSERT_TRUE(ep.is_ok()) << ep.status().to_string();
  EXPECT_EQ(*ep, Endpoint::tcp("::1", 5));
  EXPECT_EQ(parse_tcp_endpoint("tcp://h:1").value(), Endpoint::tcp("h", 1));
  Result<Endpoint> ipc = parse_tcp_endpoint("ipc:///tmp/x");
  ASSERT_FALSE(ipc.is_ok());
  EXPECT_EQ(ipc.status().code(), Code::kInvalidArgument);
  EXPECT_NE(ipc.status().message().find("only tcp://HOST:PORT"), std::string::npos) << ipc.status().message();
  // The strict parser wants a scheme.
  EXPECT_FALSE(parse_endpoint("10.0.0.2:17000").is_ok());
}

TEST(Endpoint, BadInputNamesTheTextAndTheForm) {
  struct Case {
    const char* text;
    const char* says;
  };
  const Case cases[] = {
      {"", "expected tcp://HOST:PORT"},
      {"udp://1.2.3.4:5", "expected tcp://HOST:PORT"},
      {"tcp://", "expected HOST:PORT"},
      {"tcp://127.0.0.1", "expected HOST:PORT"},
      {"tcp://:80", "expected HOST:PORT"},
      {"tcp://127.0.0.1:", "bad port ''"},
      {"tcp://127.0.0.1:65536", "bad port '65536'"},
      {"tcp://127.0.0.1:123456", "bad port '123456'"},
      {"tcp://127.0.0.1:-1", "bad port '-1'"},
      {"tcp://127.0.0.1:http", "bad port 'http'"},
      {"tcp://::1:80", "needs brackets"},
      {"tcp://[::1]80", "expected [IPV6]:PORT"},
      {"tcp://[::1", "expected [IPV6]:PORT"},
      {"tcp://[]:80", "empty IPv6 address"},
      {"ipc://", "empty ipc path"},
  };
  for (const Case& c : cases) {
    Result<Endpoint> ep = parse_endpoint(c.text);
    ASSERT_FALSE(ep.is_ok()) << c.text;
    EXPECT_EQ(ep.status().code(), Code::kInvalidArgument) << c.text;
    const std::string& msg = ep.status().message();
    EXPECT_NE(msg.find("'" + std::string(c.text) + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.says), std::string::npos) << c.text << " -> " << msg;
  }
}

}  // namespace
}  // namespace mc
