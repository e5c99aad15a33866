"""The NATS configs, checked with the pinned nats-server (nats/install-server.sh).

    python deploy/nats_check.py NATS_SERVER

1. `nats-server -c <file> -t` for nats/single.conf and nats/cluster/n1..n3.conf.
2. Each is booted for real, on loopback only: a copy whose listen addresses, routes and store_dir
   are moved to 127.0.0.1 ports and a temporary directory (nothing else changed). The single
   server must answer /healthz with JetStream; the three cluster nodes must form one JetStream
   cluster (meta group of 3 with a leader) with sync_interval always and the same max_payload.
Exit status 1 on any problem. Takes a few seconds; every server is stopped at the end.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SINGLE = ROOT / "nats" / "single.conf"
CLUSTER = ROOT / "nats" / "cluster"
NODES = ["n1", "n2", "n3"]
MAX_PAYLOAD = 256 * 1024  # nats/*.conf: max_payload: 256KB (see the comment there)
BOOT_TIMEOUT_S = 20.0

problems: list[str] = []
servers: list[subprocess.Popen] = []


def problem(text: str) -> None:
    problems.append(text)
    print(f"  FAIL {text}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def replace(text: str, old: str, new: str, where: str) -> str:
    if old not in text:
        raise SystemExit(f"nats_check: {where} no longer contains {old!r}; update deploy/nats_check.py")
    return text.replace(old, new)


def get_json(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
        return json.load(response)


def wait_healthy(port: int, label: str) -> bool:
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    last = ""
    while time.monotonic() < deadline:
        try:
            # js-enabled-only: the server is up with JetStream enabled (in a cluster the meta
            # group is checked below).
            if get_json(port, "/healthz?js-enabled-only=true").get("status") == "ok":
                return True
        except Exception as err:  # noqa: BLE001 - not up yet
            last = str(err)
        time.sleep(0.1)
    problem(f"{label}: /healthz not ok within {BOOT_TIMEOUT_S:.0f} s ({last})")
    return False


def start(server: str, conf: Path, log: Path) -> subprocess.Popen:
    process = subprocess.Popen(
        [server, "-c", str(conf)], stdout=log.open("w"), stderr=subprocess.STDOUT
    )
    servers.append(process)
    return process


def syntax(server: str) -> None:
    for conf in [SINGLE, *(CLUSTER / f"{n}.conf" for n in NODES)]:
        out = subprocess.run([server, "-c", str(conf), "-t"], capture_output=True, text=True)
        text = (out.stdout + out.stderr).strip()
        if out.returncode != 0:
            problem(f"nats-server -t {conf.relative_to(ROOT)}: {text}")
        else:
            print(f"  ok   nats-server -t {conf.relative_to(ROOT)}")


def boot_single(server: str, tmp: Path) -> None:
    before = len(problems)
    client, http = free_port(), free_port()
    text = SINGLE.read_text()
    text = replace(text, "0.0.0.0:4222", f"127.0.0.1:{client}", "single.conf")
    text = replace(text, "127.0.0.1:8222", f"127.0.0.1:{http}", "single.conf")
    text = replace(text, 'store_dir: "/data"', f'store_dir: "{tmp / "single-data"}"', "single.conf")
    conf = tmp / "single.conf"
    conf.write_text(text)
    (tmp / "auth").mkdir(exist_ok=True)
    shutil.copy(SINGLE.parent / "auth" / "auth.conf", tmp / "auth" / "auth.conf")
    start(server, conf, tmp / "single.log")
    if not wait_healthy(http, "single"):
        print((tmp / "single.log").read_text()[-2000:])
        return
    varz = get_json(http, "/varz")
    if varz.get("max_payload") != MAX_PAYLOAD:
        problem(f"single: max_payload {varz.get('max_payload')}, expected {MAX_PAYLOAD}")
    if not varz.get("jetstream", {}).get("config"):
        problem("single: JetStream is not enabled")
    if len(problems) > before:
        return
    print(f"  ok   single.conf boots: JetStream on, max_payload {varz.get('max_payload')}")


def boot_cluster(server: str, tmp: Path) -> None:
    before = len(problems)
    ports = {n: (free_port(), free_port(), free_port()) for n in NODES}  # client, http, route
    common = (CLUSTER / "common.conf").read_text()
    for node in NODES:
        client, http, route = ports[node]
        text = replace(common, "0.0.0.0:4222", f"127.0.0.1:{client}", "common.conf")
        text = replace(text, "127.0.0.1:8222", f"127.0.0.1:{http}", "common.conf")
        text = replace(text, "0.0.0.0:6222", f"127.0.0.1:{route}", "common.conf")
        text = replace(text, 'store_dir: "/data"', f'store_dir: "{tmp / node / "data"}"', "common.conf")
        for other in NODES:
            text = replace(
                text, f"nats-route://{other}:6222", f"nats-route://127.0.0.1:{ports[other][2]}", "common.conf"
            )
        left = re.findall(r"nats-route://[^\s\]]+", text)
        if any("127.0.0.1" not in r for r in left):
            problem(f"common.conf has routes to other hosts than {NODES}: {left}")
        directory = tmp / node
        directory.mkdir()
        (directory / "common.conf").write_text(text)
        (directory / "auth").mkdir(exist_ok=True)
        shutil.copy(CLUSTER / "auth" / "auth.conf", directory / "auth" / "auth.conf")
        shutil.copy(CLUSTER / f"{node}.conf", directory / f"{node}.conf")
        start(server, directory / f"{node}.conf", tmp / f"{node}.log")
    if not all(wait_healthy(ports[n][1], n) for n in NODES):
        for node in NODES:
            print(f"--- {node}.log\n" + (tmp / f"{node}.log").read_text()[-1500:])
        return
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    meta: dict = {}
    while time.monotonic() < deadline:
        meta = get_json(ports["n1"][1], "/jsz").get("meta_cluster", {})
        if meta.get("leader") and meta.get("cluster_size") == len(NODES):
            break
        time.sleep(0.2)
    else:
        problem(f"cluster: no JetStream meta leader over {len(NODES)} nodes: {meta}")
        return
    for node in NODES:
        varz = get_json(ports[node][1], "/varz")
        js = varz.get("jetstream", {}).get("config", {})
        if varz.get("server_name") != node:
            problem(f"{node}: server_name {varz.get('server_name')!r}")
        if varz.get("max_payload") != MAX_PAYLOAD:
            problem(f"{node}: max_payload {varz.get('max_payload')}, expected {MAX_PAYLOAD}")
        if js.get("sync_always") is not True:
            problem(f"{node}: JetStream sync_interval is not `always`: {js}")
        if varz.get("cluster", {}).get("name") != "switchboard":
            problem(f"{node}: cluster name {varz.get('cluster', {}).get('name')!r}")
    routes = len(get_json(ports["n1"][1], "/routez").get("routes", []))
    if len(problems) > before:
        return
    print(
        f"  ok   cluster n1..n3 boots: JetStream meta leader {meta['leader']} of {meta['cluster_size']},"
        f" sync_interval always, {routes} routes from n1, max_payload {MAX_PAYLOAD}"
    )


def main() -> int:
    server = sys.argv[1]
    print(f"nats configs ({subprocess.run([server, '--version'], capture_output=True, text=True).stdout.strip()})")
    syntax(server)
    with tempfile.TemporaryDirectory(prefix="switchboard-nats-check-") as tmp:
        try:
            boot_single(server, Path(tmp))
            boot_cluster(server, Path(tmp))
        finally:
            for process in servers:
                process.send_signal(signal.SIGTERM)
            for process in servers:
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
