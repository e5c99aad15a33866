#!/usr/bin/env bash
# Install the TypeScript SDK's pinned packages (package-lock.json) and build it (types
# generated from docs/schema, then tsc into dist/). `npm ci --engine-strict` refuses any
# package whose `engines` excludes the running Node, so on Node 20 this proves the package
# installs there as its `engines` says. Idempotent for the packages: npm ci runs only when the
# lock file or the Node version changed; the build always runs (it takes a few seconds).
set -euo pipefail

dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
stamp="${dir}/node_modules/.installed-lock"
want="$(cat "${dir}/package-lock.json"; echo "node $(node --version)")"
if [[ ! -f "${stamp}" ]] || [[ "$(cat "${stamp}")" != "${want}" ]]; then
    (cd "${dir}" && npm ci --engine-strict --ignore-scripts --no-audit --no-fund --silent)
    printf '%s' "${want}" > "${stamp}"
fi
(cd "${dir}" && npm run --silent build >/dev/null)
echo "typescript sdk: built into ${dir}/dist (node $(node --version))"
