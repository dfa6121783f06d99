#!/usr/bin/env bash
# Make sure Debian's ZooKeeper server (and a Java runtime for it) is installed: the
# metadata conformance suite runs against a real ZooKeeper. Idempotent; instant when present.
set -euo pipefail

if [ -f /usr/share/java/zookeeper.jar ] && command -v java >/dev/null 2>&1; then
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-zookeeper: /usr/share/java/zookeeper.jar is missing and there is no apt-get;" \
        "install Debian's 'zookeeper' package (ZooKeeper 3.8) and a Java runtime" >&2
    exit 1
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
fi

echo "ensure-zookeeper: installing Debian's zookeeper package" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends zookeeper >/dev/null

if [ ! -f /usr/share/java/zookeeper.jar ] || ! command -v java >/dev/null 2>&1; then
    echo "ensure-zookeeper: the zookeeper package installed but zookeeper.jar or java is" \
        "still missing" >&2
    exit 1
fi
