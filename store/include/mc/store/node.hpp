// `mc-store serve`: a storage node. Contributes dram_bytes of memory (and optionally ssd_bytes of a file
// in ssd_dir) as segments of the pool; mounts them at the master, heartbeats every heartbeat_ms, performs
// the DRAM -> SSD demotions the master asks for, and on SIGTERM/SIGINT drains, then unmounts.
//
// Drain (issue 19 item 3; DESIGN.md §8 "Drain"): on the first SIGTERM/SIGINT the node asks the master to drain
// it (store.node_drain): its segments take no new replicas but stay readable, and the master hands out pages of
// copy tasks for the objects whose every complete replica is here, each with a new replica on another node's
// DRAM. The node checks each source's checksum (DRAM: its memory; SSD: its file, read as store.node.read does),
// WRITEs the bytes to the target through its own transfer engine (with the master's write grant), and reports
// each task; it keeps heartbeating and serving SSD reads meanwhile. When the master has nothing more, after
// --drain-timeout-s, on a second stop signal, or when the master forgot the node, it unmounts; objects not moved
// are lost and counted (stderr line; mc_store_node_drain_moved_total / _dropped_total; the master's
// nodes_drained and drain_* counters, kept apart from dead_nodes). Exit 0 either way.
//
// Data path (Mooncake §5): the DRAM segment is registered with the node's own mc::transfer::TransferEngine
// listening on xfer_listen; the engine's descriptor is published at the master (the cluster's segment
// directory, directory.hpp) before every mount, and the mount names the engine segment ("host:port") and
// the DRAM segment's offset inside it. Clients READ/WRITE replicas with their own engine: shm (one memcpy)
// when on the same host — the DRAM is a memfd SharedBuffer, so nothing is left in /dev/shm even after
// SIGKILL — and tcp (or rdma) otherwise. With shm off the DRAM is private memory, served over tcp only.
// The SSD segment is a file, which the engine cannot address: its bytes are read and written through the
// node's store.node.read / store.node.write RPCs on `listen` (which refuse the DRAM segment).
//
// SSD I/O: pread/pwrite on a file opened with O_DIRECT where the file system allows it (tmpfs does
// not; then buffered I/O), through an aligned bounce buffer so any (offset, length) works.
// Segment names: "<node_id>/dram" and "<node_id>/ssd". Object table: the node applies the changes the
// master sends with each heartbeat reply (complete replicas placed on / removed from its segments: key,
// offset, size, checksum), so it can re-report its objects (store.node_report) when the master asks after a
// suspect spell, or to a restarted master (another store.info epoch), mounting its segments with restore.
// A node that the master declared dead (silent past the grace period: same epoch) forgets its table and
// publishes and mounts its segments again, empty, on its next heartbeat.
// Disks: --ssd-bytes beyond the free space of --ssd-dir is refused at start (kInvalidArgument: exit 2). A
// demotion failing with ENOSPC (kNoSpace) or EIO (kIo) is reported with its code (the master makes the tier
// read-only); a demotion whose DRAM bytes fail the object's checksum is not copied (kDataLoss). Each
// heartbeat checks that the SSD file is still there; when it vanished the tier is unmounted at the master.
// Threading: run_node() serves on the calling thread until a stop signal; the engine has its own threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mc/common/status.hpp"
#include "mc/transfer/engine.hpp"

namespace mc::store {

struct NodeOptions {
  std::string master = "tcp://127.0.0.1:7450";
  // A replicated master (master_link.hpp): with etcd set the node follows the leader of cluster_id (master ignored).
  std::string etcd;
  std::string cluster_id;
  std::string listen = "tcp://127.0.0.1:0";                      // RPC endpoint (SSD data RPCs; port 0: any free port)
  std::vector<std::string> xfer_listen = {"tcp://127.0.0.1:0"};  // transfer-engine endpoints (one path each)
  std::string node_id;                                           // empty: "<hostname>-<pid>"
  std::string host;                                              // empty: gethostname()
  std::string domain = "default";                                // failure domain label
  uint64_t dram_bytes = 256ULL << 20;
  std::string ssd_dir;  // empty: no SSD tier
  uint64_t ssd_bytes = 0;
  int heartbeat_ms = 1000;
  // At start the master must answer within this (ms; asked again every 2 s meanwhile), else start() fails with
  // kUnavailable naming it (issue 17 item 6: a daemon whose required peer is not there exits 1, bounded).
  int64_t master_wait_ms = 30'000;
  bool shm = true;       // DRAM in a memfd that same-host engines map (else tcp only)
  bool prefault = true;  // commit the DRAM at start (else on first write, in the put path)
  // Bounds of the served transfer port (transfer::EngineOptions, --xfer-max-connections, --xfer-idle-timeout-ms).
  size_t xfer_max_connections = transfer::EngineOptions{}.max_connections_served;
  int64_t xfer_idle_timeout_ms = transfer::EngineOptions{}.idle_timeout_served_ms;
  std::string metrics_listen;  // --metrics-listen: "ADDR:PORT" of GET /metrics (metrics_http.hpp); empty: off
  // --drain-timeout-s: on the first stop signal the node drains (store.node_drain) for at most this long before it
  // unmounts; 0: unmount at once (objects only here are lost, as before).
  int64_t drain_timeout_s = 30;
};

Status run_node(const NodeOptions& options);

}  // namespace mc::store
