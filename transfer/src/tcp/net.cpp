#include "tcp/net.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace mc::transfer::tcp {

Result<std::string> control_exchange(int fd, WireOp op, const std::string& aux, const std::string& what) {
  WireRequest req;
  req.op = static_cast<uint8_t>(op);
  req.aux_bytes = static_cast<uint32_t>(aux.size());
  MC_RETURN_IF_ERROR(send_all(fd, &req, sizeof req, what));
  if (!aux.empty()) MC_RETURN_IF_ERROR(send_all(fd, aux.data(), aux.size(), what));
  WireReply rep;
  MC_RETURN_IF_ERROR(recv_all(fd, &rep, sizeof rep, what));
  if (rep.magic != kWireMagic) {
    return Status(Code::kMalformedMessage, what + ": not an mc transfer engine (bad magic in reply)");
  }
  if (rep.aux_bytes > kMaxAuxBytes) {
    return Status(Code::kMessageTooLarge, what + ": reply of " + std::to_string(rep.aux_bytes) + " bytes");
  }
  std::string out(rep.aux_bytes, '\0');
  if (rep.aux_bytes > 0) MC_RETURN_IF_ERROR(recv_all(fd, out.data(), out.size(), what));
  if (rep.code != 0) return Status(static_cast<Code>(rep.code), what + ": " + out);
  return out;
}

size_t control_pipeline(int fd, WireOp op, const std::vector<std::string>& auxes, std::vector<Status>* replies,
                        Status* conn_error, const std::string& what) {
  replies->assign(auxes.size(), Status::ok());
  *conn_error = Status::ok();
  // All requests in one buffer: one send for the whole run (headers are 32 bytes, notifications ~100).
  std::string wire;
  for (const auto& aux : auxes) {
    WireRequest req;
    req.op = static_cast<uint8_t>(op);
    req.aux_bytes = static_cast<uint32_t>(aux.size());
    wire.append(reinterpret_cast<const char*>(&req), sizeof req);
    wire.append(aux);
  }
  if (Status st = send_all(fd, wire.data(), wire.size(), what); !st.is_ok()) {
    *conn_error = st;
    return 0;
  }
  std::string out;
  for (size_t i = 0; i < auxes.size(); ++i) {
    WireReply rep;
    Status st = recv_all(fd, &rep, sizeof rep, what);
    if (st.is_ok() && !reply_header_valid(rep)) {
      st = Status(Code::kMalformedMessage, what + ": bad reply header (magic or size)");
    }
    if (st.is_ok()) {
      out.assign(rep.aux_bytes, '\0');
      if (rep.aux_bytes > 0) st = recv_all(fd, out.data(), out.size(), what);
    }
    if (!st.is_ok()) {
      *conn_error = st;
      return i;
    }
    if (rep.code != 0) (*replies)[i] = Status(static_cast<Code>(rep.code), what + ": " + out);
  }
  return auxes.size();
}

Result<std::string> control_call(const std::string& endpoint, const std::string& local_address, WireOp op,
                                 const std::string& aux, int64_t timeout_ms) {
  MC_ASSIGN_OR_RETURN(Endpoint hp, parse_tcp_endpoint(endpoint));
  MC_ASSIGN_OR_RETURN(Fd fd, connect_blocking(hp, local_address, timeout_ms, timeout_ms));
  return control_exchange(fd.get(), op, aux, "peer " + format_host_port(hp.host, hp.port));
}

}  // namespace mc::transfer::tcp
