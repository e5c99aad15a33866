#!/usr/bin/env python3
"""Switchboard's call beside raw NATS request/reply and Synadia's NATS agent SDK, measured as a
user would, in one run on one nats-server (`make bench` runs it; tests/benches/report_peers.rs).

Every party is a nats-py client in this one process, so the three are measured alike:
- **raw**: `nc.request` to a subject a plain subscriber answers with the payload;
- **synadia**: `synadia-ai-agent-service`'s `AgentService` echoing each prompt, prompted through
  `synadia-ai-agents`' `Agent.prompt` (the SDK's own path, streamed chunks and the done status);
- **switchboard**: a caller's `agent.call.<me>` (waiting); the callee long-polls its goal inbox
  (`agent.inbox.fetch`, up to 64 at a time, acking with `ack_through` on its next fetch, as
  docs/protocol.md §7 suggests) and answers each request with `agent.reply.<me>`;
- **floor** (only with `--floor`): the same caller and callee, the same bodies, against the raw
  NATS steps issue 40's decided design needs for a durable call and nothing else
  (tests/benches/report_call_floor.rs plays the services' part on `bench.floor.*`).

For each: p50 and p99 of sequential calls (the paths' passes interleaved in blocks, so the
machine's drift falls on all alike), calls/s with 1 and 32 in flight, CPU per call summed
over every process named by `--pids` plus this one (utime + stime from /proc, at 32 in flight
and sequential, each also by process name), and broker messages per call (a wiretap subscription on `>` on its own
connection, on only while it counts a sequential pass of its own). Prints one JSON object on
stdout.

    python bench_peers.py --nats-url nats://127.0.0.1:4222 --ops 400 --pids 123,456
"""

import argparse
import asyncio
import json
import os
import time
import uuid

import nats

PAYLOAD = "x" * 256
IN_FLIGHT = 32
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_by_process(pids):
    """utime + stime of each process (and this one), in seconds, by its name (`comm`)."""
    seconds = {}
    for pid in pids + [os.getpid()]:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                head, tail = stat.read().rsplit(")", 1)
            name = "python (agents)" if pid == os.getpid() else head.split("(", 1)[1]
            fields = tail.split()
            seconds[name] = seconds.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / CLK_TCK
        except (OSError, IndexError, ValueError):
            pass
    return seconds


def cpu_seconds(pids):
    """utime + stime of each process (and this one), in seconds."""
    return sum(cpu_by_process(pids).values())


class Wiretap:
    """Counts every message the server routes (a subscription on `>`), only while counting:
    its own work (every message is sent to it too) is kept out of the timed passes."""

    def __init__(self):
        self.count = 0
        self.sub = None

    async def start(self, url):
        self.nc = await nats.connect(url, pending_size=256 * 1024 * 1024)

    async def count_during(self, work):
        """Messages routed while `work` runs (stray traffic settled before and after)."""

        async def seen(_msg):
            self.count += 1

        self.count = 0
        self.sub = await self.nc.subscribe(">", cb=seen, pending_msgs_limit=10_000_000,
                                           pending_bytes_limit=1 << 30)
        await self.nc.flush()
        await asyncio.sleep(0.3)
        before = self.count
        await work()
        await self.nc.flush()
        last = -1
        while last != self.count:
            last = self.count
            await asyncio.sleep(0.3)
        await self.sub.unsubscribe()
        return self.count - before


BLOCKS = 8


async def measure_all(paths, ops, pids, tap):
    """Each path's sequential p50/p99 and CPU, taken in interleaved blocks (A B C D, then
    D C B A, ...) so a drift of the machine's speed falls on every path alike; then each
    path's throughput and CPU at 32 in flight, and its broker messages per call (a separate
    pass with the wiretap on)."""
    for _, call in paths:
        for _ in range(max(ops // 10, 5)):
            await call()
    await asyncio.sleep(0.5)
    latencies = {name: [] for name, _ in paths}
    took = {name: 0.0 for name, _ in paths}
    spent = {name: {} for name, _ in paths}
    per_block = max(ops // BLOCKS, 1)
    for block in range(BLOCKS):
        order = paths if block % 2 == 0 else list(reversed(paths))
        for name, call in order:
            by_before = cpu_by_process(pids)
            started = time.perf_counter()
            for _ in range(per_block):
                t0 = time.perf_counter()
                await call()
                latencies[name].append(time.perf_counter() - t0)
            took[name] += time.perf_counter() - started
            for process, seconds in cpu_by_process(pids).items():
                delta = seconds - by_before.get(process, 0.0)
                spent[name][process] = spent[name].get(process, 0.0) + delta

    async def flight(call, n):
        remaining = [ops * 2]

        async def worker():
            while remaining[0] > 0:
                remaining[0] -= 1
                await call()

        cpu0, by0 = cpu_seconds(pids), cpu_by_process(pids)
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(n)))
        took = time.perf_counter() - t0
        by = {name: (spent - by0.get(name, 0.0)) / (ops * 2) * 1e3
              for name, spent in cpu_by_process(pids).items()}
        return (ops * 2) / took, (cpu_seconds(pids) - cpu0) / (ops * 2), by

    rows = []
    counted = max(ops // 4, 10)
    for name, call in paths:
        per_sec_32, cpu_32, by_process_32 = await flight(call, IN_FLIGHT)

        async def sequential():
            for _ in range(counted):
                await call()

        msgs = await tap.count_during(sequential) / counted
        done = per_block * BLOCKS
        ordered = sorted(latencies[name])
        by_process_1 = {process: seconds / done * 1e3 for process, seconds in spent[name].items()}
        rows.append({
            "path": name,
            "p50_ms": ordered[len(ordered) // 2] * 1e3,
            "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3,
            "per_sec_1": done / took[name],
            "per_sec_32": per_sec_32,
            "cpu_ms_sequential": sum(by_process_1.values()),
            "cpu_ms_32": cpu_32 * 1e3,
            "cpu_ms_sequential_by_process": {process: round(ms, 3)
                                             for process, ms in by_process_1.items() if ms > 0.0},
            "cpu_ms_32_by_process": {process: round(ms, 3)
                                     for process, ms in by_process_32.items() if ms > 0.0},
            "broker_msgs": msgs,
        })
    return rows


async def raw_path(url):
    server = await nats.connect(url)
    client = await nats.connect(url)

    async def echo(msg):
        await msg.respond(msg.data)

    await server.subscribe("bench.peers.echo", cb=echo)
    await server.flush()
    payload = PAYLOAD.encode()

    async def call():
        await client.request("bench.peers.echo", payload, timeout=10)

    # The echo answers before it is measured: at the end of a full report's run the first
    # request once found no responder yet (nats: no responders available for request).
    for _ in range(50):
        try:
            await call()
            break
        except nats.errors.NoRespondersError:
            await asyncio.sleep(0.1)
    else:
        raise RuntimeError("the raw echo never answered")

    return call, [server, client]


async def synadia_path(url):
    from synadia_ai.agent_service import AgentService
    from synadia_ai.agents import Agents, ResponseChunk

    host = await nats.connect(url)
    client = await nats.connect(url)
    service = AgentService(agent="bench-echo", owner="bench", session_name="main", nc=host,
                           description="echo for the peer benchmark")

    async def echo(envelope, stream):
        await stream.send(envelope.prompt)

    service.on_prompt(echo)
    await service.start()
    agents = Agents(nc=client)
    found = []
    for _ in range(50):
        found = [a for a in await agents.discover() if a.agent == "bench-echo"]
        if found:
            break
        await asyncio.sleep(0.1)
    if not found:
        raise SystemExit("the Synadia echo agent was not discovered")
    target = found[0]

    async def call():
        # The stream ends after the agent's last chunk (the SDK's end-of-stream).
        text = ""
        async for chunk in target.prompt(PAYLOAD):
            if isinstance(chunk, ResponseChunk):
                text += chunk.text
        assert text == PAYLOAD, text

    async def stop():
        await agents.close()
        await service.stop()

    return call, [host, client], stop


async def request(nc, subject, body, timeout=10):
    reply = await nc.request(subject, json.dumps(body).encode(), timeout=timeout)
    data = json.loads(reply.data)
    if "error" in data:
        raise RuntimeError(f"{subject}: {data['error']}")
    return data


async def switchboard_path(url):
    run = uuid.uuid4().hex[:8]
    callee_id, caller_id = f"bench-peer-callee-{run}", f"bench-peer-caller-{run}"
    callee = await nats.connect(url, inbox_prefix=f"_INBOX.{callee_id}".encode())
    caller = await nats.connect(url, inbox_prefix=f"_INBOX.{caller_id}".encode())
    for nc, me in ((callee, callee_id), (caller, caller_id)):
        await request(nc, f"agent.registry.register.{me}", {"description": "peer bench"})
    goal = (await request(callee, f"agent.registry.goal.open.{callee_id}", {}))["goal_id"]
    caller_goal = (await request(caller, f"agent.registry.goal.open.{caller_id}", {}))["goal_id"]
    stop = asyncio.Event()

    async def serve():
        ack = None
        while not stop.is_set():
            body = {"goal_id": goal, "max": 64, "wait_ms": 1000}
            if ack is not None:
                body["ack_through"] = ack
            page = await request(callee, f"agent.inbox.fetch.{callee_id}", body, timeout=5)
            answers = []
            for item in page["messages"]:
                message = item["message"]
                ack = item["seq"]
                if message.get("kind") == "request":
                    answers.append(request(callee, f"agent.reply.{callee_id}",
                                           {"correlation_id": message["correlation_id"],
                                            "message": message["body"]}))
            await asyncio.gather(*answers)

    server = asyncio.create_task(serve())

    async def call():
        answer = await request(caller, f"agent.call.{caller_id}",
                               {"to": callee_id, "message": PAYLOAD, "timeout_ms": 30000,
                                "from_goal_id": caller_goal}, timeout=40)
        assert len(answer["body"]) == len(PAYLOAD)

    async def halt():
        stop.set()
        await server

    return call, [callee, caller], halt


async def floor_path(url):
    """The Switchboard path's agents against the floor's raw steps (`bench.floor.*`)."""
    callee = await nats.connect(url)
    caller = await nats.connect(url)
    stop = asyncio.Event()

    async def serve():
        ack = None
        while not stop.is_set():
            body = {"goal_id": "goal", "max": 64, "wait_ms": 1000}
            if ack is not None:
                body["ack_through"] = ack
            page = await request(callee, "bench.floor.fetch", body, timeout=5)
            answers = []
            for item in page["messages"]:
                message = item["message"]
                ack = item["seq"]
                if message.get("kind") == "request":
                    answers.append(request(callee, "bench.floor.reply",
                                           {"correlation_id": message["correlation_id"],
                                            "message": message["body"]}))
            await asyncio.gather(*answers)

    server = asyncio.create_task(serve())

    async def call():
        answer = await request(caller, "bench.floor.call",
                               {"to": "callee", "message": PAYLOAD, "timeout_ms": 30000,
                                "from_goal_id": "caller-goal"}, timeout=40)
        assert len(answer["body"]) == len(PAYLOAD)

    async def halt():
        stop.set()
        await server

    return call, [callee, caller], halt


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nats-url", required=True)
    parser.add_argument("--ops", type=int, default=400)
    parser.add_argument("--pids", default="")
    parser.add_argument("--floor", action="store_true",
                        help="also measure the call's floor (bench.floor.* must be served)")
    args = parser.parse_args()
    pids = [int(p) for p in args.pids.split(",") if p]
    tap = Wiretap()
    await tap.start(args.nats_url)
    paths, conns, stops = [], [], []
    call, opened = await raw_path(args.nats_url)
    paths.append(("raw request/reply", call))
    conns += opened
    call, opened, stop = await synadia_path(args.nats_url)
    paths.append(("synadia agent SDK prompt", call))
    conns += opened
    stops.append(stop)
    call, opened, stop = await switchboard_path(args.nats_url)
    paths.append(("switchboard call (wait)", call))
    conns += opened
    stops.append(stop)
    if args.floor:
        call, opened, stop = await floor_path(args.nats_url)
        paths.append(("the call's floor (raw steps)", call))
        conns += opened
        stops.append(stop)
    rows = await measure_all(paths, args.ops, pids, tap)
    for stop in stops:
        await stop()
    for nc in conns:
        await nc.close()

    await tap.nc.close()
    print(json.dumps({"rows": rows}))


if __name__ == "__main__":
    asyncio.run(main())
