#include "mc/common/build_id.hpp"

namespace mc {
extern const char* const kBuildId;  // generated at build time (cmake/McBuildId.cmake)

const char* build_id() { return kBuildId; }

}  // namespace mc
