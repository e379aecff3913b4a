// The build's identification, "0.1.0+abc1234" (with "-dirty" for a tree with uncommitted changes): what --version,
// run headers and the hello reply name. Written at build time (cmake/McBuildId.cmake), so an incremental build never
// reports an old commit. Thread-safety: a constant.
#pragma once

namespace mc {

const char* build_id();

}  // namespace mc
