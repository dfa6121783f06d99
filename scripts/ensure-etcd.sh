#!/usr/bin/env bash
# Make sure Debian's etcd (server and etcdctl) and h2load (nghttp2-client, the load
# generator that speaks gRPC to it) are installed: bench/bench_etcd_peer.py runs a 3-member
# etcd cluster beside tally. Idempotent; instant when present.
set -euo pipefail

installed() {
    command -v etcd && command -v etcdctl && command -v h2load
} >/dev/null 2>&1

installed && exit 0
"$(dirname "$0")/apt-install.sh" ensure-etcd etcd-server etcd-client nghttp2-client
if ! installed; then
    echo "ensure-etcd: the packages installed but etcd, etcdctl or h2load is still missing" >&2
    exit 1
fi
