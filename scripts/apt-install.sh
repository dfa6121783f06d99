#!/usr/bin/env bash
# Install Debian packages quietly with apt-get, as root or through sudo: the step the
# ensure-*.sh scripts share. Usage: apt-install.sh WHO PACKAGE... (WHO prefixes messages).
set -euo pipefail

who=$1
shift
if ! command -v apt-get >/dev/null 2>&1; then
    echo "$who: there is no apt-get; install Debian's packages $*" >&2
    exit 1
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
fi

echo "$who: installing Debian's packages $*" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
