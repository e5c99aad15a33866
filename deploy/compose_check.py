"""What the compose-spec schema cannot see in docker-compose.yml (no Docker engine needed).

    python deploy/compose_check.py docker-compose.yml

References resolve (depends_on, named volumes, bind-mounted files and the NATS config each node
is started with), images are pinned, every Switchboard service lists all NATS nodes, asks for
as many stream replicas as there are nodes, exports to a collector that is in the file, has a
health check and is given more time to stop than its drain grace; the NATS routes name exactly
the compose NATS services.
Exit status 1 on any problem.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SERVICES = ["directory", "inbox-fanout", "reply-correlator", "task-lifecycle", "audit", "a2a-gateway"]

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
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
