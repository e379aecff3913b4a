#include "mc/common/endpoint.hpp"

namespace mc {
namespace {

constexpr std::string_view kTcpScheme = "tcp://";
constexpr std::string_view kIpcScheme = "ipc://";

Status bad(std::string_view text, const std::string& what) {
  return Status(Code::kInvalidArgument, "endpoint '" + std::string(text) + "': " + what);
}

// HOST:PORT or [IPV6]:PORT (no scheme); `text` is the whole input, for messages.
Result<Endpoint> parse_host_port(std::string_view rest, std::string_view text) {
  Endpoint ep;
  std::string_view port_text;
  if (!rest.empty() && rest.front() == '[') {
    const size_t close = rest.find(']');
    if (close == std::string_view::npos || close + 1 >= rest.size() || rest[close + 1] != ':') {
      return bad(text, "expected [IPV6]:PORT (e.g. tcp://[::1]:4000)");
    }
    ep.host = std::string(rest.substr(1, close - 1));
    if (ep.host.empty()) return bad(text, "empty IPv6 address in brackets");
    port_text = rest.substr(close + 2);
  } else {
    const size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos || colon == 0) {
      return bad(text, "expected HOST:PORT (e.g. tcp://127.0.0.1:4000)");
    }
    ep.host = std::string(rest.substr(0, colon));
    if (ep.host.find(':') != std::string::npos) {
      return bad(text, "an IPv6 address needs brackets (e.g. tcp://[::1]:4000)");
    }
    port_text = rest.substr(colon + 1);
  }
  if (port_text.empty() || port_text.size() > 5 || port_text.find_first_not_of("0123456789") != std::string::npos) {
    return bad(text, "bad port '" + std::string(port_text) + "' (0-65535; 0 = any free port)");
  }
  const unsigned long port = std::stoul(std::string(port_text));
  if (port > 65535) return bad(text, "bad port '" + std::string(port_text) + "' (0-65535; 0 = any free port)");
  ep.port = static_cast<uint16_t>(port);
  return ep;
}

}  // namespace

std::string format_host_port(std::string_view host, uint16_t port) {
  std::string out;
  if (host.find(':') != std::string_view::npos) {
    out.append("[").append(host).append("]");
  } else {
    out.append(host);
  }
  return out + ":" + std::to_string(port);
}

std::string Endpoint::host_port() const { return format_host_port(host, port); }

std::string Endpoint::str() const {
  if (kind == Kind::kIpc) return std::string(kIpcScheme) + path;
  return std::string(kTcpScheme) + host_port();
}

Result<Endpoint> parse_endpoint(std::string_view text) {
  if (text.substr(0, kTcpScheme.size()) == kTcpScheme) return parse_host_port(text.substr(kTcpScheme.size()), text);
  if (text.substr(0, kIpcScheme.size()) == kIpcScheme) {
    std::string_view path = text.substr(kIpcScheme.size());
    if (path.empty()) return bad(text, "empty ipc path (e.g. ipc:///tmp/mc.sock)");
    return Endpoint::ipc(std::string(path));
  }
  return bad(text, "expected tcp://HOST:PORT, tcp://[IPV6]:PORT or ipc://PATH");
}

Result<Endpoint> parse_tcp_endpoint(std::string_view text) {
  if (text.substr(0, kTcpScheme.size()) == kTcpScheme) return parse_host_port(text.substr(kTcpScheme.size()), text);
  if (text.find("://") != std::string_view::npos) {
    return bad(text, "only tcp://HOST:PORT is supported here");
  }
  return parse_host_port(text, text);
}

}  // namespace mc
