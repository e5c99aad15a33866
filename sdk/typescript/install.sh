#!/usr/bin/env bash
# Install the TypeScript SDK's pinned packages (package-lock.json) and build it (types
# generated from docs/schema, then tsc into dist/). Idempotent for the packages: npm ci runs
# only when the lock file changed; the build always runs (it takes a few seconds).
set -euo pipefail

dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
stamp="${dir}/node_modules/.installed-lock.json"
if [[ ! -f "${stamp}" ]] || ! cmp -s "${dir}/package-lock.json" "${stamp}"; then
    (cd "${dir}" && npm ci --ignore-scripts --no-audit --no-fund --silent)
    cp "${dir}/package-lock.json" "${stamp}"
fi
(cd "${dir}" && npm run --silent build >/dev/null)
echo "typescript sdk: built into ${dir}/dist"
