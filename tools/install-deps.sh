#!/usr/bin/env bash
# Installs the Debian packages mc needs to build, test and benchmark (prometheus: the metrics e2e test's scraper;
# curl and hey: the gateway's SSE framing test and its bounded load run; nftables: packet loss between namespaces;
# libcurl4-openssl-dev: the etcd client's HTTP in mc_common; libssl-dev: the etcd certificates of mc-auth init (and
# TLS to etcd through libcurl); etcd-server and etcd-client: the real etcd that etcd_test
# starts on free loopback ports, and etcdctl to look at it; gnuplot-nox: the charts of the HTML reports (--html, --svg);
# chromium: html_report_e2e_test loads those pages headless; python3: the fault matrix's log reader and mc-model's
# independent safetensors reader in model_tool_e2e_test).
# Idempotent: packages already installed are skipped; prints what it installs.
# Needs root or sudo. Usage: tools/install-deps.sh [--with-bench]
set -euo pipefail

packages=(
  build-essential clang libclang-rt-14-dev cmake ninja-build pkg-config lld
  libcli11-dev libzmq3-dev cppzmq-dev libmsgpack-cxx-dev libsodium-dev
  libxxhash-dev nlohmann-json3-dev liburing-dev libopenblas-dev libcpp-httplib-dev libpcre2-dev libabsl-dev
  libibverbs-dev librdmacm-dev
  libgtest-dev libgmock-dev libbenchmark-dev libcurl4-openssl-dev libssl-dev
  iproute2 nftables man-db groff-base jq curl hey python3 python3-numpy python3-jinja2
  prometheus etcd-server etcd-client
  clang-format clang-tidy
  gnuplot-nox chromium
)
# Node (the official openai npm client of gateway_e2e_test, tests/clients/): Debian's nodejs and npm, unless a node
# is already on PATH (another distribution's nodejs bundles its own npm, which Debian's npm would conflict with).
if ! command -v node >/dev/null 2>&1; then
  packages+=(nodejs npm)
fi
if [[ "${1:-}" == "--with-bench" ]]; then
  packages+=(redis-server redis-tools)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages already installed" >&2
  exit 0
fi

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo_cmd=(sudo)
  else
    echo "install-deps: need root or sudo to install: ${missing[*]}" >&2
    exit 1
  fi
fi

echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
# prometheus is for metrics_e2e_test and etcd-server for etcd_test, which start their own servers on free loopback
# ports: the packages' system services (prometheus on :9090, etcd on 127.0.0.1:2379, started by their postinst where
# the init system allows it) are stopped and disabled again.
for pair in prometheus:prometheus etcd-server:etcd; do
  package=${pair%%:*} service=${pair#*:}
  [[ " ${missing[*]} " == *" $package "* ]] || continue
  if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
    "${sudo_cmd[@]}" systemctl disable --now "$service" >&2 || true
  elif [[ -x /etc/init.d/$service ]]; then
    "${sudo_cmd[@]}" "/etc/init.d/$service" stop >&2 || true
    command -v update-rc.d >/dev/null 2>&1 && { "${sudo_cmd[@]}" update-rc.d "$service" disable >&2 || true; }
  fi
done
echo "install-deps: done" >&2
