"""Drives the Switchboard A2A gateway with the official A2A Python SDK (a2a-sdk) over one
binding (--binding JSONRPC or HTTP+JSON), against the `caller` agent of tests/src/a2a.rs,
which takes A2A messages as calls and chooses per message (docs/a2a.md, "Message or task"):

- a Message answer, with raw bytes parts carried both ways;
- a streamed answer as one artifact in chunks (append, lastChunk) of a working task;
- a task the agent chose, completed with the message's parts;
- a task asking twice: every question and answer in the history, cut by historyLength;
- GetTask, ListTasks (by context) and CancelTask over the binding.

Prints one JSON line with what it saw; exits non-zero on the first thing that is not as the
A2A spec says.
"""

import argparse
import asyncio
import json
import uuid

import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    TaskState,
)

from a2a_common import check, message

RAW = b"\x00\x01tck\xff"


async def one(client, request: SendMessageRequest):
    """A blocking SendMessage's one answer: ("message", Message) or ("task", Task)."""
    events = [event async for event in client.send_message(request)]
    check(len(events) == 1, f"one answer, got {events}")
    kind = events[0].WhichOneof("payload")
    return kind, getattr(events[0], kind)


def texts(history) -> list:
    return [part.text for item in history for part in item.parts if part.text]


async def run(http: httpx.AsyncClient, base: str, binding: str) -> dict:
    card = await A2ACardResolver(http, f"{base}/agents/caller").get_agent_card()
    bindings = {interface.protocol_binding for interface in card.supported_interfaces}
    check(bindings == {"JSONRPC", "HTTP+JSON"}, f"both bindings in the card: {bindings}")
    config = {"httpx_client": http, "supported_protocol_bindings": [binding]}
    blocking = ClientFactory(ClientConfig(streaming=False, **config)).create(card)
    streaming = ClientFactory(ClientConfig(**config)).create(card)
    seen: dict = {"binding": binding}

    # A call answered: a Message, not a Task; raw bytes cross both ways.
    raw = Part(raw=RAW, media_type="application/octet-stream", filename="b.bin")
    kind, answer = await one(blocking, SendMessageRequest(message=message("hi", parts=[raw])))
    check(kind == "message", f"a Message answer, got {kind}")
    check(answer.role == Role.ROLE_AGENT, f"the agent's message: {answer.role}")
    check(answer.parts[0].text == "answer: hi", f"the answer's text: {answer.parts}")
    check(answer.parts[1].raw == RAW and answer.parts[1].filename == "b.bin",
          f"raw bytes back: {answer.parts[1]}")
    check(answer.context_id != "", "the answer names its context")
    seen["message"] = answer.parts[0].text
    seen["raw"] = list(answer.parts[1].raw)

    # A streamed answer: a working task, then one artifact in chunks, then completed.
    kinds, chunks, states = [], [], []
    async for event in streaming.send_message(SendMessageRequest(message=message("stream"))):
        kind = event.WhichOneof("payload")
        kinds.append(kind)
        if kind == "task":
            states.append(TaskState.Name(event.task.status.state))
        elif kind == "artifact_update":
            update = event.artifact_update
            chunks.append([update.artifact.artifact_id, update.append, update.last_chunk,
                           update.artifact.parts[0].text])
        elif kind == "status_update":
            states.append(TaskState.Name(event.status_update.status.state))
    check(kinds[0] == "task", f"the stream starts with the task: {kinds}")
    check([chunk[1:] for chunk in chunks] == [[False, False, "one "], [True, False, "two "],
                                              [True, True, "three"]], f"chunks: {chunks}")
    check(len({chunk[0] for chunk in chunks}) == 1, f"one artifact: {chunks}")
    check(states == ["TASK_STATE_WORKING", "TASK_STATE_COMPLETED"], f"states: {states}")
    seen["chunks"] = chunks

    # The agent chose a task: the task, completed, its result and parts as the artifact.
    context = str(uuid.uuid4())
    kind, task = await one(blocking, SendMessageRequest(
        message=message("task please", context_id=context, parts=[raw])))
    check(kind == "task", f"a Task when the agent works on a task, got {kind}")
    check(task.status.state == TaskState.TASK_STATE_COMPLETED, f"completed: {task.status}")
    check(task.context_id == context, f"the task keeps its context: {task.context_id}")
    result = task.artifacts[0].parts
    check(result[0].text == "task: task please" and result[1].raw == RAW, f"result: {result}")
    seen["task"] = result[0].text

    # Two questions: each question and answer in the history, historyLength cuts it.
    kind, asked = await one(blocking, SendMessageRequest(message=message("ask twice")))
    check(kind == "task" and asked.status.state == TaskState.TASK_STATE_INPUT_REQUIRED,
          f"asks: {asked.status}")
    for answer_text in ["one", "two"]:
        kind, asked = await one(blocking, SendMessageRequest(
            message=message(answer_text, task_id=asked.id)))
    check(asked.status.state == TaskState.TASK_STATE_COMPLETED, f"answered: {asked.status}")
    full = await blocking.get_task(GetTaskRequest(id=asked.id))
    last = await blocking.get_task(GetTaskRequest(id=asked.id, history_length=2))
    none = await blocking.get_task(GetTaskRequest(id=asked.id, history_length=0))
    seen["history"] = texts(full.history)
    seen["history_2"] = texts(last.history)
    check(len(none.history) == 0, f"historyLength 0: {none.history}")
    roles = [Role.Name(item.role) for item in full.history]
    check(roles == ["ROLE_USER", "ROLE_AGENT", "ROLE_USER", "ROLE_AGENT", "ROLE_USER"],
          f"roles: {roles}")

    # ListTasks by context, and CancelTask of a task that ended.
    listed = await blocking.list_tasks(ListTasksRequest(context_id=context))
    check([listed_task.id for listed_task in listed.tasks] == [task.id], f"listed: {listed}")
    seen["listed"] = len(listed.tasks)
    try:
        await blocking.cancel_task(CancelTaskRequest(id=task.id))
        check(False, "canceling an ended task is refused")
    except Exception as refused:  # the SDK's error type differs per binding
        seen["cancel_ended"] = type(refused).__name__

    # A task given at once (returnImmediately): a task, never a call.
    later_request = SendMessageRequest(
        message=message("task later"),
        configuration=SendMessageConfiguration(return_immediately=True))
    kind, later = await one(blocking, later_request)
    check(kind == "task", f"returnImmediately gives a task: {kind}")
    for _ in range(100):
        later = await blocking.get_task(GetTaskRequest(id=later.id))
        if later.status.state == TaskState.TASK_STATE_COMPLETED:
            break
        await asyncio.sleep(0.05)
    check(later.status.state == TaskState.TASK_STATE_COMPLETED, f"later: {later.status}")
    return seen


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True, help="the gateway, e.g. http://127.0.0.1:9999")
    parser.add_argument("--token", required=True)
    parser.add_argument("--binding", default="JSONRPC", choices=["JSONRPC", "HTTP+JSON"])
    args = parser.parse_args()
    async with httpx.AsyncClient(
        timeout=60, headers={"Authorization": f"Bearer {args.token}"}
    ) as http:
        print(json.dumps(await run(http, args.base, args.binding)))


if __name__ == "__main__":
    asyncio.run(main())
