// The rdma transport when this build has no ibverbs: every entry point says so.
#include "rdma/rdma.hpp"

namespace mc::transfer::rdma {

bool built() { return false; }

Result<std::unique_ptr<RdmaDomain>> RdmaDomain::open(const EngineOptions&, const Topology&) {
  return Status(Code::kUnimplemented, kNotBuiltMessage);
}

}  // namespace mc::transfer::rdma
