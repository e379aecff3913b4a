#!/usr/bin/env bash
# Runs one libFuzzer harness of a -DMC_FUZZ=ON build until it has used CPU_SECONDS of CPU time (user + system of the
# fuzzing process, read from /proc), not wall time: on a shared machine a wall-clock -max_total_time gives less than
# the CPU-hour issue 18 asks for. Stops it with SIGINT (libFuzzer then prints its final stats) and prints one summary
# line: executions, coverage, corpus units, peak RSS, CPU and wall seconds, crash files. docs/RELIABILITY.md "Fuzzing".
#
#   tools/fuzz-long.sh [--build-dir build-fuzz] [--cpu-seconds 3600] [--input-timeout-s 10] [--work-dir /tmp/fuzz-long] HARNESS
#
# The scratch corpus is WORK_DIR/HARNESS/corpus (libFuzzer writes new units there; the checked-in seeds in
# tests/fuzz/corpus/HARNESS are read, never written); the log is WORK_DIR/HARNESS/log, crashes go to
# WORK_DIR/HARNESS/artifacts/. Exit: 0 when the run ended without a crash file, 1 with one, 2 on bad usage.
# Pause it with SIGSTOP only knowing that libFuzzer's per-input -timeout counts wall time: the input running when
# it stopped is reported as a timeout after a long enough pause (run it again alone to check). Renice it instead;
# beside a build at the lowest priority, raise --input-timeout-s (libFuzzer's -timeout, wall seconds per input) so
# that starvation is not reported as a hang.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build-fuzz
cpu_budget_s=3600
input_timeout_s=10
work_dir=/tmp/fuzz-long
usage() {
  sed -n '7p' "$0" | sed 's/^#   /usage: /' >&2
  exit 2
}
while [[ $# -gt 0 ]]; do
  case "$1" in
  --build-dir) build_dir=${2:?}; shift 2 ;;
  --cpu-seconds) cpu_budget_s=${2:?}; shift 2 ;;
  --input-timeout-s) input_timeout_s=${2:?}; shift 2 ;;
  --work-dir) work_dir=${2:?}; shift 2 ;;
  -h | --help) usage ;;
  -*) echo "fuzz-long: unknown flag $1" >&2; usage ;;
  *) break ;;
  esac
done
[[ $# -eq 1 ]] || usage
harness=$1
[[ $cpu_budget_s =~ ^[0-9]+$ && $cpu_budget_s -gt 0 ]] || { echo "fuzz-long: --cpu-seconds must be a positive integer" >&2; exit 2; }
[[ $input_timeout_s =~ ^[0-9]+$ && $input_timeout_s -gt 0 ]] || { echo "fuzz-long: --input-timeout-s must be a positive integer" >&2; exit 2; }
bin=$build_dir/tests/fuzz/$harness
seeds=tests/fuzz/corpus/$harness
[[ -x $bin ]] || { echo "fuzz-long: $bin not built (CC=clang CXX=clang++ cmake -S . -B $build_dir -G Ninja -DMC_FUZZ=ON && ninja -C $build_dir $harness)" >&2; exit 2; }
[[ -d $seeds ]] || { echo "fuzz-long: no seed corpus $seeds" >&2; exit 2; }

dir=$work_dir/$harness
mkdir -p "$dir/corpus" "$dir/artifacts"
log=$dir/log
ticks=$(getconf CLK_TCK)
start=$(date +%s)
"$bin" -print_final_stats=1 -timeout="$input_timeout_s" -rss_limit_mb=4096 -artifact_prefix="$dir/artifacts/" \
  "$dir/corpus" "$seeds" >"$log" 2>&1 &
pid=$!
trap 'kill -INT "$pid" 2>/dev/null || true' INT TERM
cpu_s=0
while kill -0 "$pid" 2>/dev/null; do
  # fields 14 and 15 of /proc/PID/stat: utime and stime in clock ticks (the name in field 2 has no spaces here)
  if read -r -a stat <"/proc/$pid/stat" 2>/dev/null; then
    cpu_s=$(((stat[13] + stat[14]) / ticks))
  fi
  if ((cpu_s >= cpu_budget_s)); then
    kill -INT "$pid" 2>/dev/null || true
    break
  fi
  sleep 5
done
wait "$pid" || true
wall_s=$(($(date +%s) - start))
last_status=$(grep -E '^#[0-9]+.* cov: ' "$log" | tail -1 || true)
final_stat() { grep -oE "stat::$1:[[:space:]]+[0-9]+" "$log" | grep -oE '[0-9]+$' || echo "?"; }
execs=$(final_stat number_of_executed_units)
rss=$(final_stat peak_rss_mb)
# crash-, leak-, timeout- and oom- files are findings; slow-unit- files (an input over 10 s) are reported apart.
crashes=$(find "$dir/artifacts" -type f ! -name "slow-unit-*" | wc -l)
slow=$(find "$dir/artifacts" -type f -name "slow-unit-*" | wc -l)
echo "fuzz-long: $harness cpu_s=$cpu_s wall_s=$wall_s executions=$execs peak_rss_mb=$rss crash_files=$crashes slow_units=$slow units=$(find "$dir/corpus" -type f | wc -l)"
echo "fuzz-long: first: $(grep -E '^#[0-9]+.*(INITED|pulse)' "$log" | head -1)"
echo "fuzz-long: last:  $last_status"
((crashes == 0))
