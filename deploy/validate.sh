#!/usr/bin/env bash
# Checks the deployment artifacts as far as a machine without Docker or Kubernetes can:
#   - nats/*.conf: `nats-server -t` with the pinned server, then booted on loopback
#     (single server; 3-node cluster forms a JetStream meta group, sync_interval always)
#   - docker-compose.yml: the compose-spec JSON schema, then references and invariants of all
#     nine services (deploy/compose_check.py SERVICES), including deploy/people.toml (people,
#     console), deploy/prometheus.yml, deploy/grafana/ (provisioning, dashboard) and the metric
#     names the dashboard queries
#   - Dockerfile: hadolint; the shell scripts: shellcheck
#   - helm/switchboard: helm lint (strict) + helm template with the default values and each
#     helm/switchboard/ci/*-values.yaml, the chart's promises read back (deploy/helm_check.py:
#     every service, the people ConfigMap, the console's port and probes), invalid values refused,
#     and every rendered manifest through kubernetes-validate --strict for each KUBE_VERSIONS
#     (custom resources such as the ServiceMonitor are checked by deploy/helm_check.py instead;
#     a manifest kubernetes-validate has no schema for fails the check)
#
# The tools are pinned in deploy/requirements.txt and installed into .tools/deploy-venv (reused
# while the requirements are unchanged); nats-server comes from nats/install-server.sh.
# Works from any directory. Exit status 1 when any check fails (all checks still run).
# Usage: deploy/validate.sh        (CI: make validate-deploy, run by .ci/run)
set -euo pipefail

# Kubernetes versions the rendered chart must be valid for: the chart's kubeVersion floor and
# the newest the pinned kubernetes-validate knows.
KUBE_VERSIONS=(1.25.0 1.37.0)

script_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd -- "${script_dir}/.." && pwd)"
cd "${repo_root}"
started="$(date +%s%N)"

venv=".tools/deploy-venv"
requirements="deploy/requirements.txt"
stamp="${venv}/.requirements.sha256"
want="$(sha256sum <"${requirements}" | cut -d' ' -f1)"
if [[ ! -x "${venv}/bin/python" || "$(cat "${stamp}" 2>/dev/null || true)" != "${want}" ]]; then
    echo "--- installing the checkers into ${venv} (deploy/requirements.txt)"
    python3 -m venv "${venv}"
    "${venv}/bin/pip" install -q --disable-pip-version-check -r "${requirements}"
    echo "${want}" >"${stamp}"
fi
bin="${repo_root}/${venv}/bin"

passed=0
failed=0
failures=()
check() {
    local name="$1"
    shift
    echo "--- ${name}"
    if "$@"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        failures+=("${name}")
        echo "  FAIL ${name}"
    fi
}

# NATS: the pinned server tests and boots every config.
bash nats/install-server.sh >/dev/null
check "nats configs (nats-server -t, boot on loopback)" \
    "${bin}/python" deploy/nats_check.py "${repo_root}/.tools/nats-server/bin/nats-server"

# Compose: schema, then what the schema cannot see.
check "docker-compose.yml against the compose-spec schema" \
    "${bin}/check-jsonschema" --builtin-schema vendor.compose-spec docker-compose.yml
check "docker-compose.yml references and invariants" \
    "${bin}/python" deploy/compose_check.py docker-compose.yml

# Image and scripts.
hadolint_dockerfile() { "${bin}/hadolint" Dockerfile && echo "  ok   hadolint Dockerfile"; }
check "hadolint Dockerfile" hadolint_dockerfile
shellcheck_scripts() {
    "${bin}/shellcheck" deploy/validate.sh deploy/docker-entrypoint.sh &&
        echo "  ok   shellcheck deploy/validate.sh deploy/docker-entrypoint.sh"
}
check "shellcheck" shellcheck_scripts

# Helm: lint + template (Helm's Go SDK), then the Kubernetes schemas.
rendered=".tools/deploy-out/rendered"
rm -rf "${rendered}"
value_sets=()
for values in helm/switchboard/ci/*-values.yaml; do
    name="$(basename "${values}" -values.yaml)"
    value_sets+=("${name}=${values}")
done
check "helm lint + helm template (default values, ${#value_sets[@]} ci value sets)" \
    "${bin}/python" deploy/helm_check.py helm/switchboard "${rendered}" "${KUBE_VERSIONS[-1]}" "${value_sets[@]}"
for version in "${KUBE_VERSIONS[@]}"; do
    kube_validate() {
        local files output
        mapfile -t files < <(find "${rendered}" -name '*.yaml' | sort)
        [[ ${#files[@]} -gt 0 ]] || { echo "  nothing rendered"; return 1; }
        # A kind without a schema only gets a warning (exit status 0): treat it as a failure.
        if ! output="$("${bin}/kubernetes-validate" --strict --quiet -k "${version}" "${files[@]}" 2>&1)"; then
            echo "${output}"
            return 1
        fi
        if grep -q '^WARN' <<<"${output}"; then
            echo "${output}"
            echo "  a rendered manifest was not validated (a custom resource belongs in CRD_KINDS in deploy/helm_check.py)"
            return 1
        fi
        echo "  ok   ${#files[@]} rendered manifest files valid for Kubernetes ${version} (strict)"
    }
    check "kubernetes-validate --strict -k ${version}" kube_validate
done

elapsed_ms=$((($(date +%s%N) - started) / 1000000))
echo "--- deployment checks done in $((elapsed_ms / 1000)).$(printf '%03d' $((elapsed_ms % 1000))) s"
if [[ ${failed} -gt 0 ]]; then
    printf '  failed: %s\n' "${failures[@]}"
fi
echo "validate-deploy: ${passed} checks ok, ${failed} failing"
[[ ${failed} -eq 0 ]]
