// make_peer_directory (engine.hpp): the peer-to-peer SegmentDirectory. A segment's name "host:port" is its
// engine's control endpoint; the descriptor is fetched from that engine over the tcp control protocol
// (WireOp::kDescribe). Publishing is a no-op: each engine answers for its own segment.
#include <memory>
#include <string>

#include "mc/proto/codec.hpp"
#include "mc/proto/transfer.hpp"
#include "mc/transfer/engine.hpp"
#include "tcp/net.hpp"

namespace mc::transfer {
namespace {

class PeerDirectory final : public SegmentDirectory {
 public:
  Result<proto::SegmentDescriptor> lookup(const std::string& name, int64_t timeout_ms) override {
    auto aux = tcp::control_call("tcp://" + name, "", tcp::WireOp::kDescribe, "", timeout_ms);
    if (!aux.is_ok()) {
      return Status(aux.status().code() == Code::kInvalidArgument ? Code::kInvalidArgument : Code::kUnavailable,
                    "segment " + name + ": cannot fetch its descriptor from the peer: " + aux.status().message() +
                        " (is `mc-xfer serve` or the owning process running there?)");
    }
    MC_ASSIGN_OR_RETURN(proto::SegmentDescriptor d,
                        codec::unpack<proto::SegmentDescriptor>(aux.value(), "descriptor of segment " + name));
    return d;
  }
  Status publish(const proto::SegmentDescriptor&) override { return Status::ok(); }
};

}  // namespace

std::shared_ptr<SegmentDirectory> make_peer_directory() { return std::make_shared<PeerDirectory>(); }

}  // namespace mc::transfer
