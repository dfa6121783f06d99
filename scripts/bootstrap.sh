#!/usr/bin/env bash
# Make a fresh machine ready: uv (into .tools/ when the machine has none) and the
# project's virtual environment from the committed uv.lock. Idempotent and quiet.
set -euo pipefail
cd "$(dirname "$0")/.."

if command -v uv >/dev/null 2>&1; then
    uv_bin=$(command -v uv)
else
    if [ ! -x .tools/bin/uv ]; then
        echo "bootstrap: installing uv into .tools/" >&2
        python3 -m venv .tools
        .tools/bin/pip install --quiet --disable-pip-version-check uv
    fi
    uv_bin=$PWD/.tools/bin/uv
fi

"$uv_bin" sync --frozen --quiet
echo "$uv_bin"
