#!/usr/bin/env bash
# Runs clang-tidy (Debian's clang-tidy, the checks of .clang-tidy) over the libraries' sources, using a
# build directory's compile_commands.json. Every finding is an error (WarningsAsErrors in .clang-tidy).
# Usage: tools/check-tidy.sh [BUILD_DIR] [FILE...]   (default build-test; default files: every library
#        source under libcommon/ transfer/ store/ model/ infer/ sched/ eval/ gateway/ text/). Env: MC_JOBS (default: number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build-test}
shift || true
jobs=${MC_JOBS:-$(nproc)}
if ! command -v clang-tidy >/dev/null 2>&1; then
  echo "check-tidy: clang-tidy not found (apt-get install clang-tidy)" >&2
  exit 1
fi
if [[ ! -f "$build_dir/compile_commands.json" ]]; then
  echo "check-tidy: $build_dir/compile_commands.json not found: configure that build first (cmake -S . -B $build_dir)" >&2
  exit 1
fi
if [[ $# -gt 0 ]]; then
  files=("$@")
else
  mapfile -t files < <(git ls-files 'libcommon/*.cpp' 'transfer/*.cpp' 'store/*.cpp' 'model/*.cpp' 'infer/*.cpp' 'sched/*.cpp' 'eval/*.cpp' 'gateway/*.cpp' 'text/*.cpp' |
                       grep -v '/bench/' | grep -v 'rdma/stub.cpp' | while read -r f; do
                         # only the sources this build compiles (the rdma/cuda parts depend on what was found)
                         grep -q "\"file\": \"$(pwd)/$f\"" "$build_dir/compile_commands.json" && echo "$f"; done)
fi
start=$(date +%s)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
printf '%s\n' "${files[@]}" | xargs -P "$jobs" -n 1 clang-tidy -p "$build_dir" --quiet >"$log" 2>&1 || status=$?
if [[ $status -ne 0 ]]; then
  grep -E 'error:|warning:' "$log" | sort -u >&2 || cat "$log" >&2
  echo "check-tidy: findings in ${#files[@]} files (see above)" >&2
  exit 1
fi
echo "check-tidy: ${#files[@]} files clean in $(( $(date +%s) - start )) s" >&2
