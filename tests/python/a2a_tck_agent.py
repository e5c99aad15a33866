#!/usr/bin/env python3
"""The agent behind the gateway when the official A2A conformance kit (a2a-tck) runs.

A Switchboard agent on nats-py and docs/protocol.md only (it reuses the raw-protocol client
of examples/python/agent.py), so a kit run proves the whole path: HTTP -> a2a-gateway ->
NATS -> this agent -> NATS -> the gateway -> HTTP. It acts on the kit's message-id prefixes
(scenarios/*.feature of a2aproject/a2a-tck, branch 1.0-dev): the A2A message id reaches it
as `metadata.a2a_message_id` of the call, the task, or the follow-up message.

Its card says `a2a_messages: "call"` (docs/a2a.md, "Message or task"): every A2A message
comes as a call. It answers `tck-message-response` as a call (the client gets a Message) and
takes every other message as a task, by answering the call with the data part
`{"switchboard": "task"}`; the task then arrives as `kind: task` and is worked here.

    python a2a_tck_agent.py --nats-url nats://127.0.0.1:4222 --agent tck
"""

import argparse
import asyncio
import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))
import nats  # noqa: E402
from agent import Agent, ServiceError, emit  # noqa: E402

HEARTBEAT_EVERY_S = 10.0
FETCH_BATCH = 32
FETCH_WAIT_MS = 1000

# What a completed task carries, by prefix (longest prefix first when matching).
FILE_RAW = {"type": "file", "uri": "data:text/plain;base64,dGNr", "mime": "text/plain",
            "name": "output.txt"}
FILE_URL = {"type": "file", "uri": "https://example.com/output.txt", "mime": "text/plain",
            "name": "output.txt"}
RESULTS = {
    "tck-artifact-text": ("Generated text content", []),
    "tck-artifact-file-url": ("", [FILE_URL]),
    "tck-artifact-file": ("", [FILE_RAW]),
    "tck-artifact-data": ("", [{"type": "data", "data": {"key": "value", "count": 42}}]),
    "tck-stream-001": ("Stream hello from TCK", []),
    "tck-stream-003": ("Stream task lifecycle", []),
    "tck-stream-ordering-001": ("Ordered output", []),
    "tck-stream-artifact-text": ("Streamed text content", []),
    "tck-stream-artifact-file": ("", [FILE_RAW]),
    "tck-complete-task": ("Hello from TCK", []),
}


def prefixed(message_id, table):
    """The entry of `table` whose key is the longest prefix of `message_id`."""
    for key in sorted(table, key=len, reverse=True):
        if message_id.startswith(key):
            return table[key]
    return None


class TckAgent(Agent):
    async def task_op(self, op, task_id, **fields):
        return await self.request(f"agent.task.{op}.{self.me}", {"task_id": task_id, **fields})

    async def work(self, task_id, message_id, goal_id, fresh):
        """Moves the task as the kit's scenario for `message_id` wants."""
        if fresh:
            if message_id.startswith("tck-reject-task"):
                await self.task_op("reject", task_id, message="rejected")
                return
            await self.task_op("accept", task_id, from_goal_id=goal_id)
        await self.task_op("start", task_id)
        if message_id.startswith("tck-input-required"):
            await self.task_op("input_required", task_id, message="Please provide input")
            return
        if message_id.startswith("test-resubscribe-message-id"):
            await asyncio.sleep(4)
        if message_id.startswith("tck-stream-artifact-chunked"):
            # Progress parts are artifact chunks as they come (docs/a2a.md).
            for text in ("chunk-1 ", "chunk-2"):
                await self.task_op("progress", task_id, parts=[{"type": "text", "text": text}])
            await self.task_op("complete", task_id)
            return
        text, parts = prefixed(message_id, RESULTS) or ("Hello from TCK", [])
        body = {"parts": parts}
        if text:
            body["message"] = text
        await self.task_op("complete", task_id, **body)

    async def handle(self, goal_id, m):
        kind, meta = m.get("kind", "message"), m.get("metadata") or {}
        message_id = str(meta.get("a2a_message_id", ""))
        emit("received", kind=kind, message_id=message_id)
        if kind == "request" and m.get("correlation_id"):
            if message_id.startswith("tck-message-response"):
                reply = {"correlation_id": m["correlation_id"],
                         "message": "Direct message response"}
            else:
                reply = {"correlation_id": m["correlation_id"], "message": "a task",
                         "parts": [{"type": "data", "data": {"switchboard": "task"}}]}
            await self.request(f"agent.reply.{self.me}", reply)
        elif kind == "task":
            await self.work(m["task"]["id"], message_id, goal_id, fresh=True)
        elif kind == "message" and meta.get("task_id"):
            # The requester's answer to a question: the task goes on.
            await self.work(meta["task_id"], message_id, goal_id, fresh=False)


async def run(args):
    nc = await nats.connect(args.nats_url, name=f"tck-agent-{args.agent}",
                            inbox_prefix=f"_INBOX.{args.agent}")
    agent = TckAgent(nc, args.agent)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    card = {"description": "The A2A conformance kit's agent",
            "max_concurrent_tasks": 100000, "metadata": {"a2a_messages": "call"}}
    await agent.request(f"agent.registry.register.{args.agent}", card)
    goal_id = (await agent.open_goal())["goal_id"]
    emit("ready", agent_id=args.agent, goal_id=goal_id)

    async def beats():
        while True:
            await asyncio.sleep(HEARTBEAT_EVERY_S)
            try:
                await agent.heartbeat()
            except ServiceError as e:
                emit("error", kind=e.kind, message=e.message)

    async def one(m):
        try:
            await agent.handle(goal_id, m)
        except ServiceError as e:
            emit("error", kind=e.kind, message=e.message)

    beating = asyncio.create_task(beats())
    while not stop.is_set():
        try:
            page = await agent.fetch(goal_id, FETCH_BATCH, FETCH_WAIT_MS)
        except ServiceError as e:
            emit("error", kind=e.kind, message=e.message)
            await asyncio.sleep(0.5)
            continue
        entries = page["messages"]
        if not entries:
            continue
        # A batch is worked at once (a 4 s task must not hold up the others), then acked.
        await asyncio.gather(*(one(entry["message"]) for entry in entries))
        await agent.ack(goal_id, entries[-1]["seq"])
    beating.cancel()
    await agent.close_goal(goal_id)
    await agent.deregister()
    await nc.close()
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    p.add_argument("--agent", default="tck")
    sys.exit(asyncio.run(run(p.parse_args())))


if __name__ == "__main__":
    main()
