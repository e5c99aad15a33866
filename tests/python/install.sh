#!/usr/bin/env bash
# Install the tests' pinned Python packages (tests/python/requirements.txt) into
# <repo>/.tools/py-venv (git-ignored). Idempotent: does nothing when the venv was built from
# the same requirements file. Works from any working directory.
set -euo pipefail

script_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd -- "${script_dir}/../.." && pwd)"
venv="${repo_root}/.tools/py-venv"
requirements="${script_dir}/requirements.txt"
stamp="${venv}/.requirements"

if [[ ! -x "${venv}/bin/python" ]] || ! cmp -s "${requirements}" "${stamp}"; then
    python3 -m venv "${venv}"
    "${venv}/bin/pip" install -q --disable-pip-version-check -r "${requirements}"
    cp "${requirements}" "${stamp}"
fi

echo "python test venv: ${venv}/bin/python ($("${venv}/bin/python" -c 'import importlib.metadata as m; print("nats-py", m.version("nats-py"), "mcp", m.version("mcp"))'))"
