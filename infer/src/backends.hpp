// Constructors of the backends (internal to mc_infer; use make_backend).
#pragma once

#include "mc/infer/backend.hpp"

namespace mc::infer {

Result<std::unique_ptr<Backend>> make_ref_backend(const BackendOptions& options);
Result<std::unique_ptr<Backend>> make_sim_backend(const BackendOptions& options);

}  // namespace mc::infer
