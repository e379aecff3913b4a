// Pure builders of the ibv_modify_qp arguments of each RC queue-pair transition (internal; only in builds
// with ibverbs). Kept apart from verbs.cpp so that the attribute values and masks are unit-tested without a
// device (tests/transfer/rdma_test.cpp). The values follow ibv_modify_qp(3)'s "required attributes" table
// for RC: RESET->INIT, INIT->RTR, RTR->RTS.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

#include "mc/common/status.hpp"
#include "mc/proto/transfer.hpp"

namespace mc::transfer::rdma {

// Local ACK timeout 4.096 us * 2^14 = 67 ms; 7 transport retries; RNR retries 7 (= infinite, harmless: the
// transport posts no SEND, so no receiver-not-ready NAK can occur); RNR timer 12 (0.64 ms).
inline constexpr uint8_t kQpTimeout = 14;
inline constexpr uint8_t kQpRetryCount = 7;
inline constexpr uint8_t kQpRnrRetry = 7;
inline constexpr uint8_t kQpMinRnrTimer = 12;
inline constexpr uint8_t kGrhHopLimit = 64;

// Which end of a one-sided transfer a QP serves. The target's QP is the one whose memory the peer reads and
// writes (REMOTE_READ | REMOTE_WRITE); the initiator's QP only posts READ/WRITE and grants no remote access
// (its local buffers are reached through their lkeys, not through the QP's access flags).
enum class QpRole { kInitiator, kTarget };

struct QpTransition {
  ibv_qp_attr attr{};
  int mask = 0;
};

// This port, as the RTR address vector needs it.
struct LocalPort {
  uint8_t port = 1;
  bool ethernet = false;  // link layer Ethernet (RoCE): the address vector must carry a GRH
  uint32_t gid_index = 0;
};

QpTransition init_transition(uint8_t port, QpRole role);
// INIT -> RTR. The peer must have passed validate_peer_qp; `path_mtu` is negotiate_mtu's result (1..5).
// The address vector: dlid = the peer's LID; a GRH (is_global, dgid, sgid_index, hop_limit) when the link
// layer is Ethernet or the peer has no LID. kInvalidArgument for a bad GID or MTU.
Result<QpTransition> rtr_transition(const LocalPort& local, const proto::RdmaQpInfo& peer, int path_mtu,
                                    uint8_t max_dest_rd_atomic);
QpTransition rts_transition(uint32_t own_psn, uint8_t max_rd_atomic);

}  // namespace mc::transfer::rdma
