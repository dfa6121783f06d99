#!/usr/bin/env bash
# Make sure Debian's ZooKeeper server (and a Java runtime for it) is installed: the
# metadata conformance suite runs against a real ZooKeeper. Idempotent; instant when present.
set -euo pipefail

installed() {
    [ -f /usr/share/java/zookeeper.jar ] && command -v java >/dev/null 2>&1
}

installed && exit 0
"$(dirname "$0")/apt-install.sh" ensure-zookeeper zookeeper
if ! installed; then
    echo "ensure-zookeeper: the zookeeper package installed but zookeeper.jar or java is" \
        "still missing" >&2
    exit 1
fi
