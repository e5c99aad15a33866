#!/usr/bin/env bash
# Install the AsyncAPI validator's pinned packages (tests/asyncapi/package-lock.json) into
# tests/asyncapi/node_modules (git-ignored). Idempotent: does nothing when they were installed
# from the same lock file. Works from any working directory.
set -euo pipefail

dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
stamp="${dir}/node_modules/.installed-lock.json"
if [[ ! -f "${stamp}" ]] || ! cmp -s "${dir}/package-lock.json" "${stamp}"; then
    # --ignore-scripts: no install script is needed (one dependency's would send telemetry).
    (cd "${dir}" && npm ci --ignore-scripts --no-audit --no-fund --silent)
    cp "${dir}/package-lock.json" "${stamp}"
fi
echo "asyncapi validator: ${dir}/node_modules ($(node -p "require('${dir}/node_modules/@asyncapi/parser/package.json').version"))"
