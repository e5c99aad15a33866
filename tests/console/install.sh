#!/usr/bin/env bash
# Install what the console's browser tests need: Debian's chromium (apt, when missing) and the
# pinned playwright-core (tests/console/package-lock.json) into tests/console/node_modules
# (git-ignored). playwright-core never downloads a browser: the tests launch /usr/bin/chromium.
# Idempotent. Works from any working directory.
set -euo pipefail

dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
if [[ ! -x /usr/bin/chromium ]]; then
    sudo=""
    if [[ "$(id -u)" != "0" ]]; then sudo="sudo"; fi
    ${sudo} apt-get update -qq
    DEBIAN_FRONTEND=noninteractive ${sudo} apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
stamp="${dir}/node_modules/.installed-lock.json"
if [[ ! -f "${stamp}" ]] || ! cmp -s "${dir}/package-lock.json" "${stamp}"; then
    (cd "${dir}" && npm ci --ignore-scripts --no-audit --no-fund --silent)
    cp "${dir}/package-lock.json" "${stamp}"
fi
echo "console browser tests: $(/usr/bin/chromium --version 2>/dev/null), playwright-core $(node -p "require('${dir}/node_modules/playwright-core/package.json').version")"
