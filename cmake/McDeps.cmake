# Locates mc's dependencies (all Debian packages; tools/install-deps.sh installs them).
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
find_package(CLI11 REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(msgpack REQUIRED CONFIG)  # Debian: msgpackc-cxx target from libmsgpack-cxx-dev
find_package(absl REQUIRED CONFIG)  # libabsl-dev: absl::btree (the store master's ordered key index)
pkg_check_modules(ZMQ REQUIRED IMPORTED_TARGET libzmq)
find_path(CPPZMQ_INCLUDE_DIR zmq.hpp REQUIRED)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
# libsodium: the fast path's authenticated encryption and the data plane's grant MACs (docs/SECURITY.md).
pkg_check_modules(SODIUM REQUIRED IMPORTED_TARGET libsodium)
pkg_check_modules(URING IMPORTED_TARGET liburing)
# cpp-httplib (Debian builds it as a shared library): the HTTP front door (mc-gateway) and every daemon's
# /metrics endpoint (--metrics-listen).
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
# libcurl: the etcd client's HTTP (etcd's JSON gateway, libcommon/coord/src/etcd.cpp), in mc_coord alone.
pkg_check_modules(CURL REQUIRED IMPORTED_TARGET libcurl)
# PCRE2 (8-bit, with Unicode properties): the pre-tokenizers' split patterns of tokenizer.json (text/, mc_text).
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
# OpenSSL's libcrypto (libssl-dev): the X.509 certificates mc-auth init makes for TLS to etcd (etcd_tls.cpp).
pkg_check_modules(LIBCRYPTO REQUIRED IMPORTED_TARGET libcrypto)

# RDMA (rdma-core): auto = build when libibverbs is found.
set(MC_HAVE_RDMA OFF)
if(NOT MC_WITH_RDMA STREQUAL "off")
  pkg_check_modules(IBVERBS IMPORTED_TARGET libibverbs)
  if(IBVERBS_FOUND)
    set(MC_HAVE_RDMA ON)
  elseif(MC_WITH_RDMA STREQUAL "on")
    message(FATAL_ERROR "MC_WITH_RDMA=on but libibverbs was not found: run tools/install-deps.sh")
  endif()
endif()
message(STATUS "mc: RDMA transport ${MC_HAVE_RDMA}")

# No CUDA: mc has no GPU memory backend and no GPU model backend yet (a GPU location is refused,
# libcommon/base/include/mc/common/location.hpp), so a CUDA toolkit found here would build nothing.
