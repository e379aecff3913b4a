// Fuzz harness: the transfer engine's TCP wire headers (transfer/src/tcp/wire.hpp), parsed as the target's
// connection loop (TcpServer) and the initiator's reply reader (control_pipeline, TcpTransport) parse them.
// Input: one control byte (bit 0: a request stream, else a reply stream), then the byte stream. A request
// stream is read header by header with check_request_header, its aux taken and, for a notification or an
// rdma connect, decoded as the target's handlers decode it (TransferNotification, RdmaConnectRequest),
// a write's payload skipped, until the stream ends or a header is refused (the target closes then).
// A reply stream is read with reply_header_valid, its aux taken and its code turned into a Status.
// Invariants: no crash or throw; a header is refused exactly when its magic, version or aux bound is wrong.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "mc/proto/codec.hpp"
#include "mc/proto/protocol.hpp"
#include "tcp/wire.hpp"

namespace {

namespace tcp = mc::transfer::tcp;

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "fuzz_transfer_wire: invariant broken: %s\n", what);
  std::abort();
}

constexpr uint64_t kMaxOpBytes = 256ull << 20;  // ServerOptions::max_op_bytes' default

void parse_requests(std::string_view in) {
  tcp::WireRequest req;
  while (tcp::read_header(in, &req)) {
    in.remove_prefix(sizeof req);
    const mc::Status st = tcp::check_request_header(req);
    const bool valid =
        req.magic == tcp::kWireMagic && req.version == tcp::kWireVersion && req.aux_bytes <= tcp::kMaxAuxBytes;
    if (st.is_ok() != valid) broken("check_request_header disagrees with the header rules");
    if (!st.is_ok()) return;
    if (in.size() < req.aux_bytes) return;  // the target waits for the aux, then the peer closes
    const std::string aux(in.substr(0, req.aux_bytes));
    in.remove_prefix(req.aux_bytes);
    switch (static_cast<tcp::WireOp>(req.op)) {
      case tcp::WireOp::kWrite:
        if (req.length > kMaxOpBytes) return;  // refused; the payload cannot be skipped
        if (in.size() < req.length) return;
        in.remove_prefix(static_cast<size_t>(req.length));
        break;
      case tcp::WireOp::kNotify:
        (void)mc::codec::unpack<mc::proto::TransferNotification>(aux, "transfer notification");
        break;
      case tcp::WireOp::kRdmaConnect:
        (void)mc::codec::unpack<mc::proto::RdmaConnectRequest>(aux, "rdma connect request");
        break;
      case tcp::WireOp::kRead:
      case tcp::WireOp::kDescribe:
      case tcp::WireOp::kPing:
        break;
      case tcp::WireOp::kRawStream:
        return;  // the rest of the connection is raw bytes (no headers), then the target closes it
      default:
        return;  // unknown op: the target replies with an error and closes
    }
  }
}

void parse_replies(std::string_view in) {
  tcp::WireReply rep;
  while (tcp::read_header(in, &rep)) {
    in.remove_prefix(sizeof rep);
    if (tcp::reply_header_valid(rep) != (rep.magic == tcp::kWireMagic && rep.aux_bytes <= tcp::kMaxAuxBytes)) {
      broken("reply_header_valid disagrees with the header rules");
    }
    if (!tcp::reply_header_valid(rep)) return;
    if (in.size() < rep.aux_bytes) return;
    const std::string aux(in.substr(0, rep.aux_bytes));
    in.remove_prefix(rep.aux_bytes);
    if (rep.code != 0) {
      const mc::Status st(static_cast<mc::Code>(rep.code), "peer: " + aux);
      if (st.is_ok() || st.to_string().empty()) broken("an error reply is not an error");
      continue;
    }
    if (static_cast<tcp::WireOp>(rep.op) == tcp::WireOp::kDescribe) {
      (void)mc::codec::unpack<mc::proto::SegmentDescriptor>(aux, "segment descriptor");
    } else if (static_cast<tcp::WireOp>(rep.op) == tcp::WireOp::kRdmaConnect) {
      (void)mc::codec::unpack<mc::proto::RdmaConnectReply>(aux, "rdma connect reply");
    } else if (static_cast<tcp::WireOp>(rep.op) == tcp::WireOp::kRead) {
      if (in.size() < rep.length) return;
      in.remove_prefix(static_cast<size_t>(rep.length));
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view stream(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) {
    parse_requests(stream);
  } else {
    parse_replies(stream);
  }
  return 0;
}
