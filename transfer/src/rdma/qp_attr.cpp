// Attribute builders of the RC queue-pair transitions (see qp_attr.hpp).
#include "rdma/qp_attr.hpp"

#include <cstring>

#include "mc/proto/transfer.hpp"
#include "rdma/rdma.hpp"

namespace mc::transfer::rdma {

QpTransition init_transition(uint8_t port, QpRole role) {
  QpTransition t;
  t.attr.qp_state = IBV_QPS_INIT;
  t.attr.pkey_index = 0;
  t.attr.port_num = port;
  t.attr.qp_access_flags = role == QpRole::kTarget ? (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE) : 0;
  t.mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  return t;
}

Result<QpTransition> rtr_transition(const LocalPort& local, const proto::RdmaQpInfo& peer, int path_mtu,
                                    uint8_t max_dest_rd_atomic) {
  if (path_mtu < IBV_MTU_256 || path_mtu > IBV_MTU_4096) {
    return Status(Code::kInvalidArgument, "path MTU enum " + std::to_string(path_mtu) + " is not 1..5");
  }
  uint8_t dgid[16];
  MC_RETURN_IF_ERROR(gid_from_hex(peer.gid, dgid));
  QpTransition t;
  ibv_qp_attr& a = t.attr;
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = static_cast<ibv_mtu>(path_mtu);
  a.dest_qp_num = peer.qp_num & 0xFFFFFFu;
  a.rq_psn = peer.psn & 0xFFFFFFu;
  a.max_dest_rd_atomic = max_dest_rd_atomic == 0 ? 1 : max_dest_rd_atomic;
  a.min_rnr_timer = kQpMinRnrTimer;
  a.ah_attr.port_num = local.port;
  a.ah_attr.sl = 0;
  a.ah_attr.src_path_bits = 0;
  a.ah_attr.dlid = local.ethernet ? 0 : static_cast<uint16_t>(peer.lid);
  if (local.ethernet || peer.lid == 0) {
    a.ah_attr.is_global = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, dgid, 16);
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(local.gid_index);
    a.ah_attr.grh.hop_limit = kGrhHopLimit;
    a.ah_attr.grh.traffic_class = 0;
    a.ah_attr.grh.flow_label = 0;
  }
  t.mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
           IBV_QP_MIN_RNR_TIMER;
  return t;
}

QpTransition rts_transition(uint32_t own_psn, uint8_t max_rd_atomic) {
  QpTransition t;
  t.attr.qp_state = IBV_QPS_RTS;
  t.attr.timeout = kQpTimeout;
  t.attr.retry_cnt = kQpRetryCount;
  t.attr.rnr_retry = kQpRnrRetry;
  t.attr.sq_psn = own_psn & 0xFFFFFFu;
  t.attr.max_rd_atomic = max_rd_atomic == 0 ? 1 : max_rd_atomic;
  t.mask =
      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
  return t;
}

}  // namespace mc::transfer::rdma
