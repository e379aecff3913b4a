#!/usr/bin/env bash
# The README's test command: installs the Debian packages mc needs (if missing), builds everything with
# AddressSanitizer + UndefinedBehaviorSanitizer and -Werror into build-test/, and runs every test through ctest.
# Usage: tools/run-tests.sh [extra ctest arguments, e.g. -L unit]
# Env: MC_TEST_BUILD_DIR (default build-test), MC_JOBS (default: number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${MC_TEST_BUILD_DIR:-build-test}
jobs=${MC_JOBS:-$(nproc)}

tools/install-deps.sh
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMC_SANITIZE=ON -DMC_WERROR=ON >/dev/null
cmake --build "$build_dir" -j "$jobs"
# Leak reports fail the run; symbolize stack traces.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" "$@"
