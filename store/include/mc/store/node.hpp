// `mc-store serve`: a storage node. Contributes dram_bytes of memory (a shared-memory file under
// /dev/shm, which same-host clients map directly) and optionally ssd_bytes of a file in ssd_dir as
// segments of the pool; mounts them at the master, heartbeats every heartbeat_ms, answers the data RPCs
// (store.node.read / store.node.write) for clients that cannot map its memory, performs the DRAM -> SSD
// demotions the master asks for, and unmounts on SIGTERM/SIGINT (removing its /dev/shm file).
//
// SSD I/O: pread/pwrite on a file opened with O_DIRECT where the file system allows it (tmpfs does
// not; then buffered I/O), through an aligned bounce buffer so any (offset, length) works.
// Segment names: "<node_id>/dram" and "<node_id>/ssd". A node that the master declared dead (missed
// heartbeats) mounts its segments again, empty, on its next heartbeat.
// Threading: run_node() serves on the calling thread until a stop signal.
#pragma once

#include <cstdint>
#include <string>

#include "mc/common/status.hpp"

namespace mc::store {

struct NodeOptions {
  std::string master = "tcp://127.0.0.1:7450";
  std::string listen = "tcp://127.0.0.1:0";  // data endpoint (port 0: any free port)
  std::string node_id;                       // empty: "<hostname>-<pid>"
  std::string host;                          // empty: gethostname()
  std::string domain = "default";            // failure domain label
  uint64_t dram_bytes = 256ULL << 20;
  std::string ssd_dir;                       // empty: no SSD tier
  uint64_t ssd_bytes = 0;
  int heartbeat_ms = 1000;
  bool shm = true;                           // back DRAM with /dev/shm (same-host zero-daemon reads)
};

Status run_node(const NodeOptions& options);

}  // namespace mc::store
