"""What the compose-spec schema cannot see in docker-compose.yml (no Docker engine needed).

    python deploy/compose_check.py docker-compose.yml

References resolve (depends_on, named volumes, bind-mounted files and the NATS config each node
is started with), images are pinned, every Switchboard service lists all NATS nodes, asks for
as many stream replicas as there are nodes, exports to a collector that is in the file, has a
health check and is given more time to stop than its drain grace; the NATS routes name exactly
the compose NATS services. People and the console read deploy/people.toml (it parses; tokens
are sha256:<64 hex>), mounted read-only where their variables point; the console listens on
every interface of its container and is published on the host's loopback on its own port (it
answers only the Host 127.0.0.1:<its port>), its trace links are http(s) with {trace_id}. The
`keys` service gives nats-config the same people file (`--people`, mounted read-only), and the
console signs in with its own key (/auth/console.nk) and reply prefix (_INBOX.console), the
other services with /auth/services.nk.

Metrics: every Switchboard service serves /metrics on a port reachable from the network, and
Prometheus (its config mounted read-only) finds every one of them by DNS on that port, so each
replica is scraped. Grafana mounts every provisioning file and the dashboard read-only where the
provisioning expects them, its data source points at the Prometheus service with the uid the
dashboard defaults to, and anonymous access is read-only. The dashboard
(deploy/grafana/switchboard-dashboard.json) parses, and each PromQL expression in it uses only
the metric names and labels in METRICS below, filters by the `service` variable, and together
they show every metric; METRICS itself is compared with the instruments defined in
shared/runtime/src/telemetry/metrics.rs.
Exit status 1 on any problem.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from pathlib import Path, PurePosixPath

import yaml

ROOT = Path(__file__).resolve().parent.parent
SERVICES = [
    "directory", "inbox-fanout", "reply-correlator", "task-lifecycle", "audit", "a2a-gateway", "people", "limits", "files", "console",
]
PEOPLE_FILE = "deploy/people.toml"
DASHBOARD = "deploy/grafana/switchboard-dashboard.json"
PROVISIONING = "deploy/grafana/provisioning"
INSTRUMENTS = "shared/runtime/src/telemetry/metrics.rs"

# The series the services export, as Prometheus names them, with the labels each carries
# besides those every scrape adds (job, instance) and otel_scope_name. The a2a-gateway's
# requests carry rpc_system and rpc_method where the other services' carry
# messaging_operation_name; error_type is present on failed requests only.
SCRAPE_LABELS = {"job", "instance", "otel_scope_name"}
_REQUEST = {"switchboard_service", "messaging_operation_name", "rpc_system", "rpc_method", "error_type"}
METRICS: dict[str, set[str]] = {
    "messaging_process_duration_seconds_bucket": _REQUEST | {"le"},
    "messaging_process_duration_seconds_sum": _REQUEST,
    "messaging_process_duration_seconds_count": _REQUEST,
    "switchboard_calls_total": {"switchboard_service", "switchboard_outcome"},
    "switchboard_task_transitions_total": {"switchboard_service", "switchboard_task_state"},
    "switchboard_inbox_evicted_total": {"switchboard_service"},
    "switchboard_inbox_dead_lettered_total": {"switchboard_service"},
    "switchboard_publish_retries_total": {"switchboard_service"},
    "switchboard_goals_live": {"switchboard_service"},
    "switchboard_inbox_messages": {"switchboard_service"},
    "switchboard_dlq_messages": {"switchboard_service"},
    "switchboard_calls_waiting": {"switchboard_service"},
    "switchboard_audit_lag": {"switchboard_service", "messaging_destination_name"},
    # Counted per process, not per service: the service comes from target_info (service_name).
    "switchboard_telemetry_export_failures": {"signal", "error_type"},
    # The OpenTelemetry resource of each process.
    "target_info": {"service_name", "service_namespace", "service_version", "service_instance_id"},
}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# What the dashboard's expressions may call, and the words of PromQL that are not names.
PROMQL_FUNCTIONS = {
    "sum", "min", "max", "avg", "count", "topk", "bottomk", "quantile", "group", "stddev",
    "rate", "irate", "increase", "delta", "deriv", "histogram_quantile", "vector", "scalar",
    "clamp_min", "clamp_max", "abs", "ceil", "floor", "round", "max_over_time", "min_over_time",
    "avg_over_time", "sum_over_time", "last_over_time", "time", "label_replace", "absent",
}
PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset"}
PROMQL_GROUPING = ("by", "without", "on", "ignoring", "group_left", "group_right")

problems: list[str] = []


def problem(text: str) -> None:
    problems.append(text)
    print(f"  FAIL {text}")


def seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    total = 0.0
    for value, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", str(duration)):
        total += float(value) * units[unit]
    return total


def main() -> int:
    path = Path(sys.argv[1])
    compose = yaml.safe_load(path.read_text())  # resolves the x-… anchors and << merges
    services: dict = compose["services"]
    volumes = set((compose.get("volumes") or {}).keys())
    nats = sorted(n for n, s in services.items() if str(s.get("image", "")).startswith("nats:"))

    for name, svc in services.items():
        for dep in svc.get("depends_on") or {}:
            if dep not in services:
                problem(f"{name}: depends_on {dep}, which is not a service")
        image = svc.get("image", "")
        if "build" not in svc and (":" not in image or image.endswith(":latest")):
            problem(f"{name}: image {image!r} is not pinned to a tag")
        for mount in svc.get("volumes") or []:
            source = mount.split(":")[0] if isinstance(mount, str) else mount.get("source", "")
            if source.startswith((".", "/")):
                if not (ROOT / source).exists():
                    problem(f"{name}: bind mount {source} does not exist")
            elif source not in volumes:
                problem(f"{name}: volume {source} is not declared under volumes:")

    # One nats-server version everywhere: the image tag is the version `make` installs.
    install = (ROOT / "nats" / "install-server.sh").read_text()
    pinned = re.search(r'NATS_SERVER_VERSION="([0-9.]+)"', install)
    for node in nats:
        image = str(services[node].get("image", ""))
        if not pinned or not image.startswith(f"nats:{pinned.group(1)}-"):
            problem(f"{node}: image {image!r} is not nats:{pinned.group(1) if pinned else '?'}-… (nats/install-server.sh)")
    # Published ports stay on the host's loopback unless an override opens them.
    for name, svc in services.items():
        for port in svc.get("ports") or []:
            if not str(port).startswith("127.0.0.1:"):
                problem(f"{name}: port {port!r} is published on every interface, not 127.0.0.1")

    # NATS nodes: started with their own config from the mounted directory.
    routes_conf = (ROOT / "nats" / "cluster" / "common.conf").read_text()
    routes = sorted(re.findall(r"nats-route://([A-Za-z0-9_-]+):6222", routes_conf))
    if routes != nats:
        problem(f"nats/cluster/common.conf routes {routes} != compose NATS services {nats}")
    for node in nats:
        svc = services[node]
        command = svc.get("command") or []
        conf = command[command.index("--config") + 1] if "--config" in command else ""
        mounts = {m.split(":")[1]: m.split(":")[0] for m in svc.get("volumes", []) if isinstance(m, str)}
        host = next(
            (Path(src) / Path(conf).relative_to(dst) for dst, src in mounts.items() if conf.startswith(dst + "/")),
            None,
        )
        if host is None or not (ROOT / host).is_file():
            problem(f"{node}: --config {conf!r} is not a mounted file")
        elif f"server_name: {node}" not in (ROOT / host).read_text():
            problem(f"{node}: {host} does not set server_name: {node}")
        if "/data" not in mounts:
            problem(f"{node}: no volume on /data (JetStream store_dir)")
        if not svc.get("healthcheck"):
            problem(f"{node}: no healthcheck")

    urls = "[" + ",".join(f"nats://{n}:4222" for n in nats) + "]"
    for name in SERVICES:
        svc = services.get(name)
        if svc is None:
            problem(f"service {name} is missing")
            continue
        env = {k: str(v) for k, v in (svc.get("environment") or {}).items()}
        if env.get("SERVICE") != name:
            problem(f"{name}: SERVICE={env.get('SERVICE')!r}")
        if env.get("SWITCHBOARD_NATS__URLS") != urls:
            problem(f"{name}: SWITCHBOARD_NATS__URLS={env.get('SWITCHBOARD_NATS__URLS')!r}, expected {urls}")
        if env.get("SWITCHBOARD_JETSTREAM__REPLICAS") != str(len(nats)):
            problem(f"{name}: SWITCHBOARD_JETSTREAM__REPLICAS is not {len(nats)}")
        otlp = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
        host = re.match(r"https?://([^:/]+)", otlp)
        if not host or host.group(1) not in services:
            problem(f"{name}: OTEL_EXPORTER_OTLP_ENDPOINT {otlp!r} is not a compose service")
        if svc.get("build") is None:
            problem(f"{name}: not built from the Dockerfile")
        if "health" not in " ".join(svc.get("healthcheck", {}).get("test", [])):
            problem(f"{name}: healthcheck does not run `health`")
        grace = int(env.get("SWITCHBOARD_SHUTDOWN_GRACE_MS", "10000")) / 1000
        if seconds(svc.get("stop_grace_period", "10s")) <= grace:
            problem(f"{name}: stop_grace_period is not above the {grace:g} s drain grace")
        missing = [n for n in nats if (svc.get("depends_on") or {}).get(n, {}).get("condition") != "service_healthy"]
        if missing:
            problem(f"{name}: does not wait for healthy {missing}")
    fanout = services.get("inbox-fanout", {}).get("deploy", {}).get("replicas")
    if fanout != 2:
        problem(f"inbox-fanout: deploy.replicas is {fanout}, expected 2")
    if not problems:
        print(
            f"  ok   {path.name}: {len(services)} services ({len(nats)} NATS nodes, inbox-fanout x{fanout}),"
            " references resolve, images pinned"
        )

    before = len(problems)
    check_people_console(services)
    if len(problems) == before:
        print(
            f"  ok   people and console: {PEOPLE_FILE} mounted read-only (keys: --people),"
            " console published on loopback, signed in with console.nk"
        )

    before = len(problems)
    check_metric_names()
    dashboard = check_dashboard()
    port = check_prometheus(services)
    check_grafana(services, dashboard)
    if len(problems) == before:
        print(
            f"  ok   metrics: every service on :{port}/metrics, scraped by Prometheus through DNS;"
            f" Grafana provisioned; {DASHBOARD} uses only the {len(METRICS)} known series"
        )
    return 1 if problems else 0


def check_people_console(services: dict) -> None:
    """People and the console read the one people file, mounted read-only where their variables
    point, and it parses with the token form the services accept. The console listens on every
    interface in its container and is published on 127.0.0.1 on the same port (its Host check
    accepts 127.0.0.1:<its own port> and localhost:<its own port> only), and it links traces to
    a compose service through an http(s) template with {trace_id}."""
    try:
        book = tomllib.loads((ROOT / PEOPLE_FILE).read_text())
    except (OSError, ValueError) as err:
        problem(f"{PEOPLE_FILE}: {err}")
        book = {}
    ids = [p.get("id") for p in book.get("person") or []]
    if len(ids) != len(set(ids)) or not ids:
        problem(f"{PEOPLE_FILE}: persons {ids} are missing or repeated")
    for person in book.get("person") or []:
        for token in person.get("tokens") or []:
            if not re.fullmatch(r"sha256:[0-9A-Fa-f]{64}", str(token)):
                problem(f"{PEOPLE_FILE}: person {person.get('id')}: token {token!r} is not sha256:<64 hex digits>")
    for name, key in (("people", "SWITCHBOARD_PEOPLE__FILE"), ("console", "SWITCHBOARD_CONSOLE__PEOPLE_FILE")):
        svc = services.get(name) or {}
        env = {k: str(v) for k, v in (svc.get("environment") or {}).items()}
        mounted = container_path(svc, PEOPLE_FILE)
        if mounted is None or env.get(key) != mounted[0]:
            problem(f"{name}: {key}={env.get(key)!r} is not where {PEOPLE_FILE} is mounted ({mounted and mounted[0]})")
        elif not mounted[1]:
            problem(f"{name}: {PEOPLE_FILE} is not mounted read-only")
        if "auth:/auth:ro" not in (svc.get("volumes") or []):
            problem(f"{name}: the auth volume (its NKey seed) is not mounted read-only at /auth")
    check_keys(services)
    console = services.get("console") or {}
    env = {k: str(v) for k, v in (console.get("environment") or {}).items()}
    listen = re.fullmatch(r"(.*):(\d+)", env.get("SWITCHBOARD_CONSOLE__LISTEN", ""))
    if not listen or listen.group(1) not in ("0.0.0.0", "[::]"):
        problem(f"console: SWITCHBOARD_CONSOLE__LISTEN={env.get('SWITCHBOARD_CONSOLE__LISTEN')!r} is not 0.0.0.0:<port>")
    else:
        want = f"127.0.0.1:{listen.group(2)}:{listen.group(2)}"
        if want not in [str(p) for p in console.get("ports") or []]:
            problem(f"console: not published as {want!r} (the host port must be the console's own port)")
    if (console.get("deploy") or {}).get("replicas", 1) != 1:
        problem("console: more than one replica (sign-ins live in one process's memory)")
    template = env.get("SWITCHBOARD_CONSOLE__TRACE_URL_TEMPLATE")
    if template is not None and (not re.match(r"https?://", template) or "{trace_id}" not in template):
        problem(f"console: SWITCHBOARD_CONSOLE__TRACE_URL_TEMPLATE {template!r} is not an http(s) URL with {{trace_id}}")
    jaeger = [str(p) for p in (services.get("jaeger") or {}).get("ports") or []]
    if template and not any(template.startswith(f"http://{p.rsplit(':', 1)[0]}/") for p in jaeger):
        problem(f"console: trace links {template!r} do not point at a published Jaeger port {jaeger}")


# What each Switchboard service signs in to NATS with (docs/security.md): the console has a user
# of its own, which may subscribe only below its reply prefix.
CONSOLE_SEED, SERVICES_SEED, CONSOLE_INBOX_PREFIX = "/auth/console.nk", "/auth/services.nk", "_INBOX.console"


def check_keys(services: dict) -> None:
    """The `keys` service runs nats-config with the people file (its operators may talk from the
    console), mounted read-only where `--people` points; the console signs in with console.nk
    and replies under _INBOX.console, every other service with services.nk."""
    keys = services.get("keys") or {}
    command = keys.get("command") or []
    script = " ".join(str(c) for c in command) if isinstance(command, list) else str(command)
    people = re.search(r"nats-config\b[^&;]*?--people\s+(\S+)", script)
    mounted = container_path(keys, PEOPLE_FILE)
    if people is None:
        problem("keys: nats-config is not given the people file (--people)")
    elif mounted is None or mounted[0] != people.group(1):
        problem(f"keys: --people {people.group(1)} is not where {PEOPLE_FILE} is mounted ({mounted and mounted[0]})")
    elif not mounted[1]:
        problem(f"keys: {PEOPLE_FILE} is not mounted read-only")
    for name in SERVICES:
        env = {k: str(v) for k, v in ((services.get(name) or {}).get("environment") or {}).items()}
        seed = env.get("SWITCHBOARD_NATS__NKEY_FILE")
        want = CONSOLE_SEED if name == "console" else SERVICES_SEED
        if seed != want:
            problem(f"{name}: SWITCHBOARD_NATS__NKEY_FILE={seed!r}, expected {want}")
        prefix = env.get("SWITCHBOARD_NATS__INBOX_PREFIX")
        if prefix != (CONSOLE_INBOX_PREFIX if name == "console" else None):
            problem(f"{name}: SWITCHBOARD_NATS__INBOX_PREFIX={prefix!r}")


def container_path(svc: dict, host: str) -> tuple[str, bool] | None:
    """Where the repository file `host` (relative to the repo root) appears in the container of
    `svc`, and whether that mount is read-only; None when no bind mount covers it."""
    want = (ROOT / host).resolve()
    for mount in svc.get("volumes") or []:
        if not isinstance(mount, str):
            continue
        parts = mount.split(":")
        if len(parts) < 2 or not parts[0].startswith((".", "/")):
            continue
        source = (ROOT / parts[0]).resolve()
        readonly = len(parts) > 2 and "ro" in parts[2].split(",")
        if want == source:
            return parts[1], readonly
        if source in want.parents:
            return str(PurePosixPath(parts[1]) / want.relative_to(source).as_posix()), readonly
    return None


def check_metric_names() -> None:
    """METRICS lists what shared/runtime/src/telemetry/metrics.rs defines, in Prometheus names:
    dots become underscores, counters end in _total, histograms in s end in _seconds_bucket,
    _seconds_sum and _seconds_count."""
    source = (ROOT / INSTRUMENTS).read_text()
    defined: set[str] = set()
    for name in re.findall(r'\.u64_counter\(\s*"([a-z0-9_.]+)"', source):
        defined.add(name.replace(".", "_") + "_total")
    for name, unit in re.findall(r'\.f64_histogram\(\s*"([a-z0-9_.]+)"\s*\)\s*\.with_unit\(\s*"([^"]*)"', source):
        base = name.replace(".", "_") + ("_seconds" if unit == "s" else "")
        defined.update(base + suffix for suffix in HISTOGRAM_SUFFIXES)
    gauges = re.search(r"pub const GAUGES[^=]*=\s*&\[(.*?)\n\];", source, re.S)
    for name in re.findall(r'\(\s*"([a-z0-9_.]+)"\s*,', gauges.group(1) if gauges else ""):
        defined.add(name.replace(".", "_"))
    if not defined or not gauges:
        problem(f"{INSTRUMENTS}: found no counters, histograms or GAUGES to compare METRICS with")
        return
    listed = set(METRICS) - {"target_info"}
    for name in sorted(defined - listed):
        problem(f"{INSTRUMENTS} defines {name}, which METRICS in deploy/compose_check.py does not list")
    for name in sorted(listed - defined):
        problem(f"METRICS lists {name}, which {INSTRUMENTS} does not define")


def promql_names(expr: str) -> tuple[list[tuple[str, dict[str, tuple[str, str]]]], set[str], list[str]]:
    """The series selectors of a PromQL expression (metric name, {label: (operator, value)}),
    the labels named in by/without/on/ignoring/group_left/group_right, and what cannot be read.
    Enough for the dashboard's expressions; not a full PromQL parser."""
    errors: list[str] = []
    depth = 0
    for char in expr:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            break
    if depth != 0:
        errors.append("unbalanced parentheses")
    text = re.sub(r"\[[^\]]*\]", " ", expr)  # range selectors, e.g. [$__rate_interval]
    grouping: set[str] = set()

    def clause(match: re.Match) -> str:
        grouping.update(label.strip() for label in match.group(2).split(",") if label.strip())
        return " "

    text = re.sub(r"\b(" + "|".join(PROMQL_GROUPING) + r")\s*\(([^)]*)\)", clause, text)
    selectors: list[tuple[str, dict[str, tuple[str, str]]]] = []
    token = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)(\s*\{[^}]*\})?")
    matcher = re.compile(r'\s*([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
    position = 0
    rest = []
    for match in token.finditer(text):
        rest.append(text[position : match.start()])
        position = match.end()
        name, block = match.group(1), match.group(2)
        following = text[match.end() :].lstrip()[:1]
        if block is None and following == "(":
            if name not in PROMQL_FUNCTIONS:
                errors.append(f"unknown function {name}()")
            continue
        if block is None and name in PROMQL_KEYWORDS:
            continue
        labels: dict[str, tuple[str, str]] = {}
        if block is not None:
            inner = block.strip()[1:-1]
            at = 0
            while at < len(inner.strip()):
                found = matcher.match(inner, at)
                if not found:
                    errors.append(f"cannot read the matchers {{{inner}}}")
                    break
                labels[found.group(1)] = (found.group(2), found.group(3))
                at = found.end()
        selectors.append((name, labels))
    rest.append(text[position:])
    leftover = re.sub(r"[\s()+\-*/,^%<>=!]|\d+(\.\d+)?([eE][+-]?\d+)?", "", "".join(rest))
    if leftover:
        errors.append(f"cannot read {leftover!r}")
    return selectors, grouping, errors


def dashboard_panels(panels: list[dict]) -> list[dict]:
    """Every panel, including those inside collapsed rows."""
    found: list[dict] = []
    for panel in panels:
        found.append(panel)
        found.extend(dashboard_panels(panel.get("panels") or []))
    return found


def check_dashboard() -> dict:
    """The dashboard parses, has the variables the provisioning and the expressions rely on, and
    its expressions use only METRICS, each filtered by $service."""
    path = ROOT / DASHBOARD
    before = len(problems)
    try:
        dashboard = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        problem(f"{DASHBOARD}: {err}")
        return {}
    for key, want in (("uid", "switchboard"), ("title", "Switchboard")):
        if dashboard.get(key) != want:
            problem(f"{DASHBOARD}: {key} is {dashboard.get(key)!r}, expected {want!r}")
    if not isinstance(dashboard.get("schemaVersion"), int) or dashboard["schemaVersion"] < 36:
        problem(f"{DASHBOARD}: schemaVersion {dashboard.get('schemaVersion')!r} is below 36")
    variables = {v.get("name"): v for v in (dashboard.get("templating") or {}).get("list", [])}
    source = variables.get("datasource", {})
    if source.get("type") != "datasource" or source.get("query") != "prometheus":
        problem(f"{DASHBOARD}: no `datasource` variable of Prometheus data sources")
    service = variables.get("service", {})
    query = service.get("query")
    query = query.get("query") if isinstance(query, dict) else query
    want_query = "label_values(messaging_process_duration_seconds_count, switchboard_service)"
    if service.get("type") != "query" or query != want_query:
        problem(f"{DASHBOARD}: the `service` variable does not query {want_query}")
    if (service.get("datasource") or {}).get("uid") != "${datasource}":
        problem(f"{DASHBOARD}: the `service` variable does not use ${{datasource}}")

    panels = dashboard_panels(dashboard.get("panels") or [])
    ids = [p.get("id") for p in panels]
    if len(ids) != len(set(ids)) or None in ids:
        problem(f"{DASHBOARD}: panel ids are missing or repeated")
    used: set[str] = set()
    exprs = 0
    for panel in panels:
        title = panel.get("title", f"panel {panel.get('id')}")
        kind = panel.get("type")
        if kind == "row":
            continue
        if kind not in ("timeseries", "stat"):
            problem(f"{DASHBOARD}: {title}: panel type {kind!r} (timeseries or stat expected)")
        grid = panel.get("gridPos") or {}
        if not all(isinstance(grid.get(k), int) for k in "hwxy") or grid["x"] + grid["w"] > 24:
            problem(f"{DASHBOARD}: {title}: gridPos {grid} is not within the 24 columns")
        targets = panel.get("targets") or []
        if not targets:
            problem(f"{DASHBOARD}: {title}: no targets")
        for target in [panel] + targets:
            uid = (target.get("datasource") or {}).get("uid")
            if uid != "${datasource}":
                problem(f"{DASHBOARD}: {title}: data source {uid!r}, not ${{datasource}}")
        for target in targets:
            expr = target.get("expr", "")
            exprs += 1
            if not expr.strip():
                problem(f"{DASHBOARD}: {title}: target {target.get('refId')} has no expr")
                continue
            selectors, grouping, errors = promql_names(expr)
            for error in errors:
                problem(f"{DASHBOARD}: {title}: {error} in {expr}")
            labels_here: set[str] = set(SCRAPE_LABELS)
            for name, matchers in selectors:
                if name not in METRICS:
                    problem(f"{DASHBOARD}: {title}: {name} is not a metric the services export")
                    continue
                used.add(name)
                known = METRICS[name] | SCRAPE_LABELS
                labels_here |= known
                for label in sorted(set(matchers) - known):
                    problem(f"{DASHBOARD}: {title}: {name} has no label {label}")
                # Every selector follows the dashboard's service filter.
                by = "service_name" if name == "target_info" else "switchboard_service"
                if by in METRICS[name] and matchers.get(by) != ("=~", "$service"):
                    problem(f'{DASHBOARD}: {title}: {name} is not filtered by {by}=~"$service"')
            if not selectors:
                problem(f"{DASHBOARD}: {title}: no metric in {expr}")
            for label in sorted(grouping - labels_here):
                problem(f"{DASHBOARD}: {title}: groups by {label}, which none of its metrics has")
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in METRICS if n != "target_info"}
    shown = {re.sub(r"_(bucket|sum|count)$", "", n) for n in used}
    for family in sorted(families - shown):
        problem(f"{DASHBOARD}: no panel shows {family}")
    if len(problems) == before:
        print(f"  ok   {DASHBOARD}: {len(panels)} panels, {exprs} expressions over {len(used)} known series")
    return dashboard


def check_prometheus(services: dict) -> int:
    """Every Switchboard service serves /metrics on one port, reachable from other containers,
    and Prometheus discovers each of them (every replica) by DNS on that port."""
    ports: set[int] = set()
    for name in SERVICES:
        env = {k: str(v) for k, v in ((services.get(name) or {}).get("environment") or {}).items()}
        listen = env.get("SWITCHBOARD_TELEMETRY__METRICS_LISTEN", "")
        found = re.fullmatch(r"(.*):(\d+)", listen)
        if not found:
            problem(f"{name}: SWITCHBOARD_TELEMETRY__METRICS_LISTEN={listen!r} is not host:port")
            continue
        if found.group(1) not in ("0.0.0.0", "[::]", ""):
            problem(f"{name}: /metrics listens on {found.group(1)}, which Prometheus cannot reach")
        ports.add(int(found.group(2)))
        for what, key in (("the A2A gateway", "SWITCHBOARD_A2A_GATEWAY__LISTEN"), ("the console", "SWITCHBOARD_CONSOLE__LISTEN")):
            if env.get(key, "").endswith(f":{found.group(2)}"):
                problem(f"{name}: /metrics and {what} both listen on port {found.group(2)}")
    if len(ports) != 1:
        problem(f"the services serve /metrics on ports {sorted(ports)}, expected one port")
        return 0
    port = ports.pop()

    prometheus = services.get("prometheus")
    if prometheus is None:
        problem("service prometheus is missing")
        return port
    if not str(prometheus.get("image", "")).startswith("prom/prometheus:"):
        problem(f"prometheus: image {prometheus.get('image')!r} is not prom/prometheus")
    command = [str(c) for c in prometheus.get("command") or []]
    config_path = next(
        (c.split("=", 1)[1] for c in command if c.startswith("--config.file=")), "/etc/prometheus/prometheus.yml"
    )
    mounted = container_path(prometheus, "deploy/prometheus.yml")
    if mounted is None or mounted[0] != config_path:
        problem(f"prometheus: deploy/prometheus.yml is not mounted at its --config.file {config_path}")
    elif not mounted[1]:
        problem("prometheus: deploy/prometheus.yml is not mounted read-only")
    config = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text()) or {}
    unknown = set(config) - {"global", "scrape_configs", "rule_files", "alerting", "remote_write", "storage"}
    if unknown:
        problem(f"deploy/prometheus.yml: unknown top-level keys {sorted(unknown)}")
    discovered: dict[str, set[int]] = {}
    for scrape in config.get("scrape_configs") or []:
        if scrape.get("metrics_path", "/metrics") != "/metrics":
            problem(f"deploy/prometheus.yml: job {scrape.get('job_name')}: metrics_path is not /metrics")
        for sd in scrape.get("dns_sd_configs") or []:
            if sd.get("type") != "A" or "port" not in sd:
                job = scrape.get("job_name")
                problem(f"deploy/prometheus.yml: job {job}: dns_sd_configs without type A and a port")
                continue
            for name in sd.get("names") or []:
                discovered.setdefault(name, set()).add(int(sd["port"]))
        for static in scrape.get("static_configs") or []:
            for target in static.get("targets") or []:
                if target.split(":")[0] in SERVICES:
                    problem(
                        f"deploy/prometheus.yml: static target {target} reaches one replica per scrape;"
                        " list the service under dns_sd_configs (type A) instead"
                    )
    for name in SERVICES:
        if discovered.get(name) != {port}:
            problem(f"deploy/prometheus.yml: {name} is not discovered by DNS on port {port}")
    for name in sorted(set(discovered) - set(services)):
        problem(f"deploy/prometheus.yml: {name} is not a compose service")
    return port


def check_grafana(services: dict, dashboard: dict) -> None:
    """Grafana mounts the provisioning files and the dashboard where the provisioning expects
    them, its data source is the compose Prometheus, and anonymous visitors may only view."""
    grafana = services.get("grafana")
    if grafana is None:
        problem("service grafana is missing")
        return
    if not str(grafana.get("image", "")).startswith("grafana/grafana:"):
        problem(f"grafana: image {grafana.get('image')!r} is not grafana/grafana")
    env = {k: str(v) for k, v in (grafana.get("environment") or {}).items()}
    if env.get("GF_AUTH_ANONYMOUS_ENABLED") != "true":
        problem("grafana: GF_AUTH_ANONYMOUS_ENABLED is not true")
    if env.get("GF_AUTH_ANONYMOUS_ORG_ROLE", "Viewer") != "Viewer":
        problem(f"grafana: anonymous visitors get role {env['GF_AUTH_ANONYMOUS_ORG_ROLE']}, not Viewer")

    files = sorted(p for p in (ROOT / PROVISIONING).rglob("*") if p.is_file())
    if not files:
        problem(f"{PROVISIONING}: no provisioning files")
    providers: list[str] = []
    sources: list[dict] = []
    for file in files:
        relative = file.relative_to(ROOT).as_posix()
        mounted = container_path(grafana, relative)
        want = "/etc/grafana/provisioning/" + file.relative_to(ROOT / PROVISIONING).as_posix()
        if mounted is None or mounted[0] != want:
            problem(f"grafana: {relative} is not mounted at {want}")
        elif not mounted[1]:
            problem(f"grafana: {relative} is not mounted read-only")
        content = yaml.safe_load(file.read_text()) or {}
        sources.extend(content.get("datasources") or [])
        for provider in content.get("providers") or []:
            if provider.get("type", "file") == "file":
                providers.append(str((provider.get("options") or {}).get("path", "")))
    board = container_path(grafana, DASHBOARD)
    if board is None:
        problem(f"grafana: {DASHBOARD} is not mounted")
    else:
        if not board[1]:
            problem(f"grafana: {DASHBOARD} is not mounted read-only")
        if not any(p and PurePosixPath(p) in PurePosixPath(board[0]).parents for p in providers):
            problem(f"grafana: {DASHBOARD} is mounted at {board[0]}, under no file provider's path {providers}")
        home = env.get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
        if home is not None and home != board[0]:
            problem(f"grafana: GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH {home} is not the dashboard's {board[0]}")

    variables = {v.get("name"): v for v in (dashboard.get("templating") or {}).get("list", [])}
    default_uid = ((variables.get("datasource") or {}).get("current") or {}).get("value")
    prometheus = [s for s in sources if s.get("type") == "prometheus"]
    if len(prometheus) != 1:
        problem(f"{PROVISIONING}: {len(prometheus)} Prometheus data sources, expected 1")
        return
    source = prometheus[0]
    if source.get("uid") != default_uid:
        problem(f"{PROVISIONING}: data source uid {source.get('uid')!r} is not the dashboard's default {default_uid!r}")
    url = re.fullmatch(r"http://([^:/]+):(\d+)/?", str(source.get("url", "")))
    if not url or not str((services.get(url.group(1)) or {}).get("image", "")).startswith("prom/prometheus:"):
        problem(f"{PROVISIONING}: data source url {source.get('url')!r} is not the compose Prometheus")
    elif url.group(2) != "9090":
        problem(f"{PROVISIONING}: data source url {source.get('url')!r}: Prometheus listens on 9090")
    deps = grafana.get("depends_on") or {}
    if url and url.group(1) not in deps:
        problem(f"grafana: does not depend on {url.group(1)}")


if __name__ == "__main__":
    sys.exit(main())
