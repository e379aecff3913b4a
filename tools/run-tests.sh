#!/usr/bin/env bash
# The README's test command: installs the Debian packages mc needs (if missing), builds everything with clang,
# AddressSanitizer + UndefinedBehaviorSanitizer and -Werror into build-test/, and runs every test through ctest.
# Usage: tools/run-tests.sh [--quick] [extra ctest arguments, e.g. -L unit]
#   --quick  a newcomer's check in a few minutes: builds only the libraries and the unit-test programs, without
#            sanitizers (-O1, no debug info), into build-quick/, and runs the unit tests (ctest -L unit).
# Env: MC_TEST_BUILD_DIR (default build-test; build-quick with --quick), MC_JOBS (default: number of cores),
#      MC_TEST_CC / MC_TEST_CXX (default clang / clang++).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${MC_JOBS:-$(nproc)}

tools/install-deps.sh
if [[ "${1:-}" == "--quick" ]]; then
  shift
  build_dir=${MC_TEST_BUILD_DIR:-build-quick}
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -DNDEBUG" \
    -DMC_SANITIZE=OFF -DMC_WERROR=ON -DMC_BUILD_BENCH=OFF -DMC_UNITY_BUILD=ON >/dev/null
  cmake --build "$build_dir" -j "$jobs" --target mc_unit_tests
  ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" -L unit "$@"
  exit
fi
build_dir=${MC_TEST_BUILD_DIR:-build-test}
# clang: its sanitized build at -O0 takes 40 % of GCC's at -O1 (CMakeLists.txt; docs/BENCHMARKS.md "Build and test
# time"). MC_TEST_CXX=g++ MC_TEST_CC=gcc builds with GCC instead (a build directory of the other compiler is
# configured anew).
# Unity batches (MC_UNITY_BUILD): about half the compiler time of a whole build (CMakeLists.txt).
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMC_SANITIZE=ON -DMC_WERROR=ON \
  -DMC_UNITY_BUILD=ON "-DCMAKE_C_COMPILER=${MC_TEST_CC:-clang}" "-DCMAKE_CXX_COMPILER=${MC_TEST_CXX:-clang++}" >/dev/null
cmake --build "$build_dir" -j "$jobs"
# Leak reports fail the run; symbolize stack traces.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" "$@"
