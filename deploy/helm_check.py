"""helm lint + helm template for helm/switchboard, through Helm's own Go SDK (helm-python-sdk
embeds Helm v4 as a shared library: the real template engine, lint rules and values parser).

    python deploy/helm_check.py CHART OUT_DIR KUBE_VERSION [NAME=VALUES_FILE ...]

For the default values, the built-in value sets in EXTRA_CASES and each values file: lint
(strict: warnings fail), render as release `switchboard` in namespace `switchboard`, write
every manifest to OUT_DIR/<name>/<template> (for kubernetes-validate), and check what the chart
promises (probes, grace period, non-root, the Secret, the people file and its ConfigMap, the
console's port, Service and settings, metrics: the listen address, the `metrics` container and
Service ports, the ServiceMonitor). Then values that must be refused are rendered and must fail.

Objects of CRD_KINDS (the Prometheus Operator's ServiceMonitor) are not written to OUT_DIR:
kubernetes-validate has no schema for them and would pass them with a warning. They are checked
here instead: apiVersion, the endpoint (port `metrics`, path /metrics, the interval), and that
the selector picks exactly the release's Services that expose the metrics port.
Exit status 1 on any problem.
"""

from __future__ import annotations

import os
import re
import sys
import tomllib
from pathlib import Path

import helm_python as helm
import yaml

SERVICES = [
    "directory", "inbox-fanout", "reply-correlator", "task-lifecycle", "audit", "a2a-gateway", "people", "limits", "files", "console",
]
# Where the people and console pods find the people file (a ConfigMap mounted as a directory).
PEOPLE_DIR = "/etc/switchboard/people"
PEOPLE_FILE = f"{PEOPLE_DIR}/people.toml"
RELEASE, NAMESPACE = "switchboard", "switchboard"
# Custom resources: checked here, not by kubernetes-validate (see above).
CRD_KINDS = {"ServiceMonitor"}
METRICS_ENV = "SWITCHBOARD_TELEMETRY__METRICS_LISTEN"
# The metrics values a plain install gets.
METRICS_DEFAULTS = {
    "enabled": True,
    "port": 9464,
    "serviceMonitor": {"enabled": False, "interval": "15s", "labels": {}},
}
# Value sets rendered besides the default values and helm/switchboard/ci/*-values.yaml.
EXTRA_CASES: dict[str, dict] = {
    "metrics-off": {"metrics": {"enabled": False}},
    "people-off": {"services": {"people": {"enabled": False}, "console": {"enabled": False}}},
}

# Values the chart must refuse (helm template fails with the given text).
MUST_FAIL = {
    "unknown auth type": ({"nats": {"auth": {"type": "basic"}}}, "nats.auth.type must be one of"),
    "user without password": (
        {"nats": {"auth": {"type": "userPassword", "user": "svc", "existingSecret": ""}}},
        "nats.auth.password is required",
    ),
    "no NATS url": ({"nats": {"urls": []}}, "nats.urls must list at least one server"),
    "jetstream replicas 0": ({"jetstream": {"replicas": 0}}, "jetstream.replicas must be 1..5"),
    "unknown service": ({"services": {"gateway": {"enabled": True}}}, "not a Switchboard service"),
    "persistent index with 2 audit replicas": (
        {"auditIndex": {"persistence": {"enabled": True}}, "services": {"audit": {"replicas": 2}}},
        "auditIndex.persistence needs services.audit.replicas = 1",
    ),
    "metrics port 0": ({"metrics": {"port": 0}}, "metrics.port must be 1..65535"),
    "metrics on the A2A port": (
        {"metrics": {"port": 9999}, "a2aGateway": {"port": 9999}},
        "is the A2A gateway's port",
    ),
    "ServiceMonitor without metrics": (
        {"metrics": {"enabled": False, "serviceMonitor": {"enabled": True}}},
        "metrics.serviceMonitor.enabled needs metrics.enabled",
    ),
    "two console replicas": ({"services": {"console": {"replicas": 2}}}, "services.console.replicas must be 1"),
    "metrics on the console port": (
        {"metrics": {"port": 8090}, "console": {"port": 8090}},
        "is the console's port",
    ),
    "console port 0": ({"console": {"port": 0}}, "console.port must be 1..65535"),
    "trace links without {trace_id}": (
        {"console": {"traceUrlTemplate": "javascript:alert(1)"}},
        "console.traceUrlTemplate must be an http(s) URL with {trace_id}",
    ),
    "allowed hosts not a list": ({"console": {"allowedHosts": "console.example.com"}}, "console.allowedHosts must be a list"),
}

problems: list[str] = []
monitors_rendered = 0


def problem(text: str) -> None:
    problems.append(text)
    print(f"  FAIL {text}")


def lint(chart: str, values: dict | None, kube: str, label: str) -> None:
    report = helm.lint(chart, values, strict=True, kube_version=f"v{kube}")
    for message in report.get("messages", []):
        # severity 1 = info (e.g. "icon is recommended"), 2 = warning, 3 = error.
        if message["severity"] >= 2:
            problem(f"[{label}] helm lint: {message['path']}: {message['error']}")
    for error in report.get("errors", []):
        problem(f"[{label}] helm lint: {error}")


def check_objects(objects: list[dict], values: dict, label: str) -> None:
    """What the chart promises, read back from the rendered objects."""
    merged = values
    grace = int(merged["shutdownGraceMs"]) // 1000 + 10
    enabled = [s for s in SERVICES if merged["services"][s]["enabled"]]
    deployments = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Deployment"}
    pdbs = {o["metadata"]["name"]: o for o in objects if o["kind"] == "PodDisruptionBudget"}
    if len(deployments) != len(enabled) or len(pdbs) != len(enabled):
        problem(f"[{label}] {len(deployments)} Deployments / {len(pdbs)} PDBs for {len(enabled)} services")
    for service in enabled:
        name = next((n for n in deployments if n.endswith(f"-{service}")), None)
        if name is None:
            problem(f"[{label}] no Deployment for {service}")
            continue
        pod = deployments[name]["spec"]["template"]["spec"]
        container = pod["containers"][0]
        env = {e["name"]: e for e in container.get("env", [])}
        for probe in ("readinessProbe", "livenessProbe"):
            if service == "console":
                # No micro service to PING: the page on its port, with the Host it answers.
                host = f"127.0.0.1:{int(merged['console']['port'])}"
                want = {"path": "/api/me", "port": "console", "httpHeaders": [{"name": "Host", "value": host}]}
                if container.get(probe, {}).get("httpGet") != want:
                    problem(f"[{label}] console: {probe} is not GET /api/me on port console with Host {host}")
            elif container.get(probe, {}).get("exec", {}).get("command") != [service, "health"]:
                problem(f"[{label}] {service}: {probe} is not [{service}, health]")
        if pod.get("terminationGracePeriodSeconds") != grace:
            problem(f"[{label}] {service}: terminationGracePeriodSeconds != {grace}")
        if not pod.get("securityContext", {}).get("runAsNonRoot"):
            problem(f"[{label}] {service}: not runAsNonRoot")
        if env.get("SERVICE", {}).get("value") != service:
            problem(f"[{label}] {service}: SERVICE env is not {service}")
        if merged["nats"]["auth"]["type"] == "nkey" and env.get("SWITCHBOARD_NATS__NKEY_FILE", {}).get(
            "value"
        ) != "/etc/switchboard/nats/services.nk":
            problem(f"[{label}] {service}: nkey auth without SWITCHBOARD_NATS__NKEY_FILE")
        urls = "[" + ",".join(merged["nats"]["urls"]) + "]"
        if env.get("SWITCHBOARD_NATS__URLS", {}).get("value") != urls:
            problem(f"[{label}] {service}: SWITCHBOARD_NATS__URLS is not {urls}")
        grants = merged.get("skillGrants", {}).get("existingConfigMap")
        grants_env = env.get("SWITCHBOARD_DIRECTORY__SKILL_GRANTS_FILE", {}).get("value")
        if service == "directory" and grants:
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            if grants_env != "/etc/switchboard/grants/skill-grants.json":
                problem(f"[{label}] directory: skill grants set but SWITCHBOARD_DIRECTORY__SKILL_GRANTS_FILE is {grants_env!r}")
            if volumes.get("skill-grants", {}).get("configMap", {}).get("name") != grants:
                problem(f"[{label}] directory: the skill grants ConfigMap {grants!r} is not mounted")
        elif grants_env is not None:
            problem(f"[{label}] {service}: SWITCHBOARD_DIRECTORY__SKILL_GRANTS_FILE without skillGrants")
        check_people(pod, env, service, merged, label)
        replicas = int(merged["services"][service]["replicas"])
        pdb = pdbs.get(name, {}).get("spec", {})
        want = {"minAvailable": 1} if replicas > 1 else {"maxUnavailable": 1}
        if {k: pdb.get(k) for k in want} != want:
            problem(f"[{label}] {service}: PodDisruptionBudget is not {want}")
    auth = merged["nats"]["auth"]
    secrets = [o for o in objects if o["kind"] == "Secret"]
    rendered_secret = (
        auth["type"] != "none"
        and not auth["existingSecret"]
        and (auth["type"] != "nkey" or bool(auth["nkeySeed"]))
    )
    if bool(secrets) != rendered_secret:
        problem(f"[{label}] a Secret was{'' if secrets else ' not'} rendered for auth {auth['type']}")
    check_people_configmap(objects, merged, label)
    check_metrics(objects, merged, label)


def people_configmap(merged: dict) -> str:
    return merged["people"]["existingConfigMap"] or f"{RELEASE}-people"


def check_people(pod: dict, env: dict, service: str, merged: dict, label: str) -> None:
    """People and the console read the people file from the ConfigMap, mounted as a directory
    (so the kubelet updates it); the console listens on console.port on every interface, with
    its settings from the values. Nobody else mounts the file."""
    container = pod["containers"][0]
    mounts = {m["name"]: m for m in container.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pod.get("volumes", [])}

    def value(key: str) -> str | None:
        return env.get(key, {}).get("value")

    key = {"people": "SWITCHBOARD_PEOPLE__FILE", "console": "SWITCHBOARD_CONSOLE__PEOPLE_FILE"}.get(service)
    if key is None:
        if "people" in mounts:
            problem(f"[{label}] {service}: mounts the people file")
        return
    if value(key) != PEOPLE_FILE:
        problem(f"[{label}] {service}: {key} is {value(key)!r}, expected {PEOPLE_FILE}")
    mount = mounts.get("people", {})
    if mount.get("mountPath") != PEOPLE_DIR or not mount.get("readOnly") or "subPath" in mount:
        problem(f"[{label}] {service}: the people file is not mounted read-only as the directory {PEOPLE_DIR}")
    config_map = volumes.get("people", {}).get("configMap", {})
    want = {"name": people_configmap(merged), "items": [{"key": "people.toml", "path": "people.toml"}]}
    if config_map != want:
        problem(f"[{label}] {service}: the people volume is {config_map}, expected {want}")
    if service != "console":
        return
    console = merged["console"]
    port = int(console["port"])
    if value("SWITCHBOARD_CONSOLE__LISTEN") != f"0.0.0.0:{port}":
        problem(f"[{label}] console: SWITCHBOARD_CONSOLE__LISTEN is {value('SWITCHBOARD_CONSOLE__LISTEN')!r}")
    ports = {p["name"]: p for p in container.get("ports", [])}
    if ports.get("console") != {"name": "console", "containerPort": port, "protocol": "TCP"}:
        problem(f"[{label}] console: no container port console = {port}")
    hosts = console["allowedHosts"]
    want_hosts = "[" + ",".join(f'"{h}"' for h in hosts) + "]" if hosts else None
    if value("SWITCHBOARD_CONSOLE__ALLOWED_HOSTS") != want_hosts:
        problem(f"[{label}] console: SWITCHBOARD_CONSOLE__ALLOWED_HOSTS is {value('SWITCHBOARD_CONSOLE__ALLOWED_HOSTS')!r}, expected {want_hosts!r}")
    template = console["traceUrlTemplate"] or None
    if value("SWITCHBOARD_CONSOLE__TRACE_URL_TEMPLATE") != template:
        problem(f"[{label}] console: SWITCHBOARD_CONSOLE__TRACE_URL_TEMPLATE is not {template!r}")
    if int(merged["services"]["console"]["replicas"]) != 1:
        problem(f"[{label}] console: {merged['services']['console']['replicas']} replicas (sessions are in memory)")


def check_people_configmap(objects: list[dict], merged: dict, label: str) -> None:
    """The chart renders the people file's ConfigMap when people or the console runs and no
    existing one is named, with `people.file` as people.toml, and it parses."""
    reads = merged["services"]["people"]["enabled"] or merged["services"]["console"]["enabled"]
    want = reads and not merged["people"]["existingConfigMap"]
    maps = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-people")]
    if len(maps) != int(want):
        problem(f"[{label}] {len(maps)} people ConfigMaps rendered, expected {int(want)}")
        return
    for config_map in maps:
        if config_map["metadata"]["name"] != people_configmap(merged):
            problem(f"[{label}] the people ConfigMap is {config_map['metadata']['name']}")
        text = (config_map.get("data") or {}).get("people.toml")
        if text is None or text.strip() != str(merged["people"]["file"]).strip():
            problem(f"[{label}] the people ConfigMap's people.toml is not people.file")
            continue
        try:
            book = tomllib.loads(text)
        except ValueError as err:
            problem(f"[{label}] people.file does not parse: {err}")
            continue
        for person in book.get("person") or []:
            for token in person.get("tokens") or []:
                if not re.fullmatch(r"sha256:[0-9A-Fa-f]{64}", str(token)):
                    problem(f"[{label}] people.file: person {person.get('id')}: token {token!r} is not sha256:<64 hex>")


def subset(small: dict, big: dict) -> bool:
    return all(big.get(k) == v for k, v in small.items())


def check_metrics(objects: list[dict], merged: dict, label: str) -> None:
    """With metrics.enabled every service listens for /metrics on metrics.port, names that
    container port `metrics` and has a Service exposing it; without, none of that exists. The
    ServiceMonitor renders exactly when metrics.serviceMonitor.enabled, and selects exactly the
    Services that expose the port."""
    global monitors_rendered
    metrics = merged["metrics"]
    enabled = bool(metrics["enabled"])
    port = int(metrics["port"])
    if label == "default" and metrics != METRICS_DEFAULTS:
        problem(f"[{label}] metrics defaults are {metrics}, expected {METRICS_DEFAULTS}")
    services = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Service"}
    deployments = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Deployment"}
    for name, deployment in deployments.items():
        component = deployment["metadata"]["labels"].get("app.kubernetes.io/component")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        ports = {p["name"]: p for p in container.get("ports", [])}
        service = services.get(name)
        service_ports = {p["name"]: p for p in (service or {}).get("spec", {}).get("ports", [])}
        if not enabled:
            if METRICS_ENV in env or "metrics" in ports or "metrics" in service_ports:
                problem(f"[{label}] {component}: metrics disabled, yet the env, container or Service port is there")
            continue
        if env.get(METRICS_ENV) != f"0.0.0.0:{port}":
            problem(f"[{label}] {component}: {METRICS_ENV} is {env.get(METRICS_ENV)!r}, expected 0.0.0.0:{port}")
        if ports.get("metrics") != {"name": "metrics", "containerPort": port, "protocol": "TCP"}:
            problem(f"[{label}] {component}: no container port metrics = {port}")
        if service is None:
            problem(f"[{label}] {component}: no Service {name} for the metrics port")
            continue
        want = {"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"}
        if service_ports.get("metrics") != want:
            problem(f"[{label}] {component}: Service port metrics is {service_ports.get('metrics')}, expected {want}")
        selector = service["spec"].get("selector") or {}
        if selector != deployment["spec"]["selector"]["matchLabels"]:
            problem(f"[{label}] {component}: the Service selects {selector}, not the Deployment's pods")
    gateway = next((s for n, s in services.items() if n.endswith("-a2a-gateway")), None)
    if merged["services"]["a2a-gateway"]["enabled"]:
        ports = {p["name"]: p for p in (gateway or {}).get("spec", {}).get("ports", [])}
        if ports.get("a2a", {}).get("port") != int(merged["a2aGateway"]["port"]):
            problem(f"[{label}] a2a-gateway: the Service does not expose port a2a")
    console = services.get(f"{RELEASE}-console")
    if merged["services"]["console"]["enabled"]:
        ports = {p["name"]: p for p in (console or {}).get("spec", {}).get("ports", [])}
        port = int(merged["console"]["port"])
        want = {"name": "console", "port": port, "targetPort": "console", "protocol": "TCP"}
        if ports.get("console") != want or (console or {}).get("spec", {}).get("clusterIP") == "None":
            problem(f"[{label}] console: the Service does not expose port console = {port} on a cluster IP")
    elif console is not None:
        problem(f"[{label}] console: disabled, yet its Service is rendered")

    monitors = [o for o in objects if o["kind"] == "ServiceMonitor"]
    want_monitor = enabled and bool(metrics["serviceMonitor"]["enabled"])
    if len(monitors) != int(want_monitor):
        problem(f"[{label}] {len(monitors)} ServiceMonitors rendered, expected {int(want_monitor)}")
    monitors_rendered += len(monitors)
    for monitor in monitors:
        if monitor.get("apiVersion") != "monitoring.coreos.com/v1":
            problem(f"[{label}] ServiceMonitor apiVersion {monitor.get('apiVersion')}")
        if monitor["metadata"].get("namespace") != NAMESPACE:
            problem(f"[{label}] ServiceMonitor is not in namespace {NAMESPACE}")
        if not subset(metrics["serviceMonitor"]["labels"] or {}, monitor["metadata"].get("labels") or {}):
            problem(f"[{label}] ServiceMonitor lacks the labels {metrics['serviceMonitor']['labels']}")
        spec = monitor.get("spec") or {}
        interval = str(metrics["serviceMonitor"]["interval"])
        want = [{"port": "metrics", "path": "/metrics", "scheme": "http", "interval": interval}]
        if spec.get("endpoints") != want:
            problem(f"[{label}] ServiceMonitor endpoints are {spec.get('endpoints')}, expected {want}")
        if (spec.get("namespaceSelector") or {}).get("matchNames") != [NAMESPACE]:
            problem(f"[{label}] ServiceMonitor does not look in namespace {NAMESPACE} only")
        match = (spec.get("selector") or {}).get("matchLabels") or {}
        selected = {n for n, s in services.items() if match and subset(match, s["metadata"].get("labels") or {})}
        exposing = {n for n, s in services.items() if any(p["name"] == "metrics" for p in s["spec"]["ports"])}
        if not exposing or selected != exposing:
            problem(f"[{label}] ServiceMonitor selects {sorted(selected)}, the metrics Services are {sorted(exposing)}")


def render(chart: str, values: dict | None, out: Path, label: str) -> int:
    with helm.Chart.load(chart) as loaded:
        manifests = loaded.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
        merged = loaded.merge_values(values)
    out.mkdir(parents=True, exist_ok=True)
    objects: list[dict] = []
    for template, text in sorted(manifests.items()):
        if template.endswith("NOTES.txt"):
            if "Switchboard" not in text:
                problem(f"[{label}] NOTES.txt did not render")
            continue
        docs = [d for d in yaml.safe_load_all(text) if d]
        if not docs:
            continue
        objects.extend(docs)
        custom = [d["kind"] in CRD_KINDS for d in docs]
        if all(custom):
            continue  # checked in check_metrics, not by kubernetes-validate
        if any(custom):
            problem(f"[{label}] {template} mixes custom resources with built-in kinds")
        (out / Path(template).name).write_text(text)
    kinds: dict[str, int] = {}
    for obj in objects:
        kinds[obj["kind"]] = kinds.get(obj["kind"], 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    print(f"  ok   [{label}] lint + template: {summary}")
    check_objects(objects, merged, label)
    return len(objects)


def main() -> int:
    chart, out_dir, kube, *sets = sys.argv[1:]
    out = Path(out_dir)
    cases: list[tuple[str, dict | None]] = [("default", None), *EXTRA_CASES.items()]
    for spec in sets:
        label, _, path = spec.partition("=")
        cases.append((label, helm.values_from_yaml(Path(path).read_text())))
    print(f"helm (Go SDK {helm.helm_sdk_version()}, via helm-python-sdk): chart {chart}")
    for label, values in cases:
        lint(chart, values, kube, label)
        try:
            render(chart, values, out / label, label)
        except helm.HelmError as err:
            problem(f"[{label}] helm template: {err}")
    for label, (values, expected) in MUST_FAIL.items():
        try:
            with helm.Chart.load(chart) as loaded:
                loaded.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
        except helm.HelmError as err:
            if expected not in str(err):
                problem(f"refused for another reason ({label}): {err}")
            continue
        problem(f"values accepted that must be refused: {label}")
    if monitors_rendered == 0:
        problem("no value set renders the ServiceMonitor (helm/switchboard/ci/monitoring-values.yaml enables it)")
    if not problems:
        print(f"  ok   {len(MUST_FAIL)} invalid value sets refused")
    return 1 if problems else 0


if __name__ == "__main__":
    os.environ.setdefault("HELM_CACHE_HOME", os.path.join(os.path.dirname(__file__), "..", ".tools", "helm-cache"))
    sys.exit(main())
