// The message types the fuzz harnesses decode: every msgpack struct of the protocol (mc/proto/*.hpp), in the
// order of that header. A harness input's first byte picks one (byte % kMessageTypes); the seed generator
// (seeds.cpp) names its files by the same index, so keep the order stable and append new messages at the
// end of their section as protocol.hpp does (a reordered list only makes the checked-in seeds stale:
// `fuzz_seeds --check` says so).
#pragma once

#include <cstddef>
#include <tuple>
#include <utility>

#include "mc/proto/protocol.hpp"

namespace mc::fuzz {

using MessageTypes = std::tuple<
    proto::Header, proto::ErrorReply, proto::HelloReply, proto::HelloRequest, proto::PingReply, proto::PingRequest,
    proto::StatReply, proto::StatRequest, proto::KvEvent, proto::RegionDescriptor, proto::SegmentDescriptor,
    proto::RdmaQpInfo, proto::RdmaConnectReply, proto::RdmaConnectRequest, proto::TransferNotification,
    proto::PublishSegmentReply, proto::PublishSegmentRequest, proto::GetSegmentReply, proto::GetSegmentRequest,
    proto::StoreAck, proto::StoreReplica, proto::StoreMountRequest, proto::StoreUnmountRequest, proto::StoreDemoteTask,
    proto::StoreDemoteResult, proto::StoreNodeSegmentUsage, proto::StoreNodeObjectChange,
    proto::StoreNodeHeartbeatReply, proto::StoreNodeHeartbeatRequest, proto::StoreClientHeartbeatRequest,
    proto::StorePutStartItem, proto::StorePutStartReply, proto::StorePutStartRequest, proto::StoreItemsReply,
    proto::StorePutEndRequest, proto::StorePutRevokeRequest, proto::StoreGetItem, proto::StoreGetReplicasReply,
    proto::StoreGetReplicasRequest, proto::StoreReplicaEndRequest, proto::StoreExistsReply, proto::StoreExistsRequest,
    proto::StoreMatchPrefixReply, proto::StoreMatchPrefixRequest, proto::StoreRemoveRequest, proto::StoreObjectInfo,
    proto::StoreLsReply, proto::StoreLsRequest, proto::StoreSegmentStat, proto::StoreStatReply, proto::StoreStatRequest,
    proto::StoreInfoReply, proto::StoreInfoRequest, proto::StoreNodeWriteRequest, proto::StoreNodeReadReply,
    proto::StoreNodeReadRequest, proto::StorePinRequest, proto::StoreUnpinRequest, proto::StoreReportCorruptRequest,
    proto::StoreNodeObject, proto::StoreNodeReportReply, proto::StoreNodeReportRequest, proto::RequestLedger,
    proto::DecodeReserveReply, proto::DecodeReserveRequest, proto::DecodeReleaseReply, proto::DecodeReleaseRequest,
    proto::DecodeAbortRequest, proto::KvWriteReply, proto::KvWriteRequest, proto::KvCommitReply, proto::KvCommitRequest,
    proto::PrefillJobReply, proto::PrefillJobRequest, proto::WorkerLoadReply, proto::WorkerLoadRequest,
    proto::ClientAck, proto::TokenEvent, proto::RequestDone, proto::RequestError, proto::ConductorSubmitReply,
    proto::ConductorSubmitRequest, proto::ConductorRegisterReply, proto::ConductorRegisterRequest,
    proto::ConductorHeartbeatReply, proto::DecodeStepSample, proto::ConductorHeartbeatRequest,
    proto::ConductorJobReportReply, proto::ConductorJobReportRequest, proto::ConductorStatusReply,
    proto::ConductorStatusRequest, proto::StoreReplicateNearReply, proto::StoreReplicateNearRequest,
    proto::ConductorCancelReply, proto::ConductorCancelRequest, proto::DecodeCancelReply, proto::DecodeCancelRequest,
    proto::PrefillCancelReply, proto::PrefillCancelRequest, proto::ConductorDrainReply, proto::ConductorDrainRequest,
    proto::StoreDrainTask, proto::StoreDrainResult, proto::StoreNodeDrainReply, proto::StoreNodeDrainRequest,
    proto::PrefillStageHiddenReply, proto::PrefillStageHiddenRequest, proto::PrefillStageSlotReply,
    proto::PrefillStageSlotRequest>;

inline constexpr size_t kMessageTypes = std::tuple_size_v<MessageTypes>;

// Calls fn.template operator()<T>() for the index-th type of MessageTypes (index < kMessageTypes).
template <typename Fn, size_t I = 0>
void with_message_type(size_t index, Fn&& fn) {
  if constexpr (I < kMessageTypes) {
    if (index == I) {
      fn.template operator()<std::tuple_element_t<I, MessageTypes>>();
    } else {
      with_message_type<Fn, I + 1>(index, static_cast<Fn&&>(fn));
    }
  }
}

// Calls fn.template operator()<T>() for every type of MessageTypes, with its index.
template <typename Fn>
void for_each_message_type(Fn&& fn) {
  [&]<size_t... I>(std::index_sequence<I...>) {
    (fn.template operator()<std::tuple_element_t<I, MessageTypes>>(I), ...);
  }
  (std::make_index_sequence<kMessageTypes>{});
}

}  // namespace mc::fuzz
