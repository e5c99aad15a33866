"""A fleet of agents sharing one provider limit through leases (docs/protocol.md §15), driven by
tests/limits.rs: `AGENTS` agents in this process (the Python SDK), each calling the fake LLM
provider `CALLS` times, each call inside `async with agent.limit(key, tokens=…)`. Prints one
JSON line: every acquire's wait (ms) by agent, the 429s and other failures the agents saw.

    python limits_fleet.py NATS_URL LLM_URL KEY PREFIX AGENTS CALLS
"""

import asyncio
import json
import sys
import time

import httpx

from switchboard import Agent


async def worker(agent: Agent, llm_url: str, key: str, calls: int, start: asyncio.Event,
                 report: dict) -> None:
    agent_id = agent.id
    waits: list[float] = []
    try:
        async with httpx.AsyncClient(base_url=llm_url, timeout=30) as http:
            await start.wait()
            for _ in range(calls):
                asked = time.monotonic()
                async with agent.limit(key, tokens=150, wait_ms=60_000) as lease:
                    waits.append((time.monotonic() - asked) * 1000)
                    posted = time.monotonic()
                    reply = await http.post("/v1/chat", json={"prompt": "hello"})
                    report["http_ms"].append((time.monotonic() - posted) * 1000)
                    released = time.monotonic()
                    if reply.status_code == 429:
                        report["refused"] += 1
                    elif reply.status_code != 200:
                        report["failed"].append(f"{agent_id}: HTTP {reply.status_code}")
                    else:
                        lease.used(reply.json()["usage"]["total_tokens"])
                report["release_ms"].append((time.monotonic() - released) * 1000)
    except Exception as err:  # noqa: BLE001 - every failure is reported to the test
        report["failed"].append(f"{agent_id}: {type(err).__name__}: {err}")
    finally:
        report["waits"][agent_id] = waits
        await agent.close()


async def main() -> None:
    nats_url, llm_url, key, prefix = sys.argv[1:5]
    agents, calls = int(sys.argv[5]), int(sys.argv[6])
    report: dict = {"waits": {}, "refused": 0, "failed": [], "http_ms": [], "release_ms": []}
    start = asyncio.Event()
    fleet = await asyncio.gather(*(Agent.connect(nats_url, f"{prefix}-{n}", open_goal=False)
                                   for n in range(agents)))
    tasks = [asyncio.create_task(worker(agent, llm_url, key, calls, start, report))
             for agent in fleet]
    # Every agent is connected; they all start together on a line from the test.
    print(json.dumps({"ready": True}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    start.set()
    await asyncio.gather(*tasks)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
