#!/usr/bin/env python3
"""Switchboard's call beside raw NATS request/reply and Synadia's NATS agent SDK, measured as a
user would, in one run on one nats-server (`make bench` runs it; tests/benches/report_peers.rs).

Every party is a nats-py client in this one process, so the three are measured alike:
- **raw**: `nc.request` to a subject a plain subscriber answers with the payload;
- **synadia**: `synadia-ai-agent-service`'s `AgentService` echoing each prompt, prompted through
  `synadia-ai-agents`' `Agent.prompt` (the SDK's own path, streamed chunks and the done status);
- **switchboard**: a caller's `agent.call.<me>` (waiting); the callee long-polls its goal inbox
  (`agent.inbox.fetch`, up to 64 at a time, acking with `ack_through` on its next fetch, as
  docs/protocol.md §7 suggests) and answers each request with `agent.reply.<me>`.

For each: p50 and p99 of sequential calls, calls/s with 1 and 32 in flight, CPU per call summed
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


async def measure(name, call, ops, pids, tap):
    """Sequential p50/p99 and CPU, throughput and CPU at 32 in flight, then broker messages
    per call (a separate pass with the wiretap on)."""
    for _ in range(max(ops // 10, 5)):
        await call()
    await asyncio.sleep(0.5)
    cpu_before, by_before = cpu_seconds(pids), cpu_by_process(pids)
    latencies = []
    started = time.perf_counter()
    for _ in range(ops):
        t0 = time.perf_counter()
        await call()
        latencies.append(time.perf_counter() - t0)
    sequential_s = time.perf_counter() - started
    cpu_sequential = cpu_seconds(pids) - cpu_before
    by_process_1 = {name: (spent - by_before.get(name, 0.0)) / ops * 1e3
                    for name, spent in cpu_by_process(pids).items()}
    latencies.sort()

    async def flight(n):
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

    per_sec_32, cpu_32, by_process_32 = await flight(IN_FLIGHT)
    counted = max(ops // 4, 10)

    async def sequential():
        for _ in range(counted):
            await call()

    msgs = await tap.count_during(sequential) / counted
    return {
        "path": name,
        "p50_ms": latencies[len(latencies) // 2] * 1e3,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3,
        "per_sec_1": ops / sequential_s,
        "per_sec_32": per_sec_32,
        "cpu_ms_sequential": cpu_sequential / ops * 1e3,
        "cpu_ms_32": cpu_32 * 1e3,
        "cpu_ms_sequential_by_process": {name: round(ms, 3)
                                         for name, ms in by_process_1.items() if ms > 0.0},
        "cpu_ms_32_by_process": {name: round(ms, 3) for name, ms in by_process_32.items()
                                 if ms > 0.0},
        "broker_msgs": msgs,
    }


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


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nats-url", required=True)
    parser.add_argument("--ops", type=int, default=400)
    parser.add_argument("--pids", default="")
    args = parser.parse_args()
    pids = [int(p) for p in args.pids.split(",") if p]
    tap = Wiretap()
    await tap.start(args.nats_url)
    rows = []

    call, conns = await raw_path(args.nats_url)
    rows.append(await measure("raw request/reply", call, args.ops, pids, tap))
    for nc in conns:
        await nc.close()

    call, conns, stop = await synadia_path(args.nats_url)
    rows.append(await measure("synadia agent SDK prompt", call, args.ops, pids, tap))
    await stop()
    for nc in conns:
        await nc.close()

    call, conns, stop = await switchboard_path(args.nats_url)
    rows.append(await measure("switchboard call (wait)", call, args.ops, pids, tap))
    await stop()
    for nc in conns:
        await nc.close()

    await tap.nc.close()
    print(json.dumps({"rows": rows}))


if __name__ == "__main__":
    asyncio.run(main())
