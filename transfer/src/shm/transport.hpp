// The shm transport: same host, different processes. Internal header.
#pragma once

#include <memory>
#include <string>

#include "mc/transfer/engine.hpp"
#include "mc/transfer/transport.hpp"

namespace mc::transfer::shm {

// Reaches a segment whose descriptor has this host's host_id and whose every region lives in a memfd or
// /dev/shm file (shm_path) this process can open; maps those files and moves each request with one memcpy,
// split over options.shm_threads worker threads plus the caller for requests of at least
// options.shm_parallel_min_bytes. post() copies synchronously in the calling thread.
std::unique_ptr<Transport> make_shm_transport(const EngineOptions& options, std::string local_host_id);

// "boot_id/hostname/net:[inode]": this machine's kernel and this process's network namespace. Equal values
// mean the same kernel (so memfds can be shared) and the same network host: processes in two network
// namespaces of one machine are different hosts (tcp between them), as the namespace cluster needs.
std::string local_host_id();

}  // namespace mc::transfer::shm
