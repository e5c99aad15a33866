"""Drives the Switchboard A2A gateway with the official A2A Python SDK (a2a-sdk), as any A2A
client would. Run by tests/a2a.rs against a gateway in front of an `echo` agent (answers
`echo: <text>`, `slow` after 1.5 s), a `sleeper` agent (never takes its tasks) and, for the
`input` phase, an `asker` agent (asks "which language?", then completes with `in <answer>`).

Phases (--phase):
  all           card discovery, blocking and non-blocking SendMessage, a streamed task with
                its events in order, GetTask, ListTasks, CancelTask, no token refused;
  stream-start  start a streamed `slow` task, read the task and its first status update, stop
                (the caller restarts the gateway), print the task id and the last event seen;
  stream-resume SubscribeToTask with Last-Event-ID (--task, --after): every later event;
  push          a task with a webhook (--webhook) given with the message, run to completion;
  input         the input-required round trip with the `asker` agent.
Prints one JSON line with what it saw; exits non-zero on the first thing that is not as the
A2A spec says.
"""

import argparse
import asyncio
import json

import httpx
from a2a.client import A2ACardResolver, ClientCallContext, ClientConfig, ClientFactory
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    SendMessageConfiguration,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskPushNotificationConfig,
    TaskState,
)

from a2a_common import check, message


def event_seq(event) -> int:
    """The gateway's `switchboardEventSeq` of a stream item (the SDK hides SSE ids)."""
    kind = event.WhichOneof("payload")
    item = getattr(event, kind)
    return int(item.metadata["switchboardEventSeq"])


async def clients(http: httpx.AsyncClient, base: str, agent: str):
    card = await A2ACardResolver(http, f"{base}/agents/{agent}").get_agent_card()
    blocking = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
    streaming = ClientFactory(ClientConfig(httpx_client=http)).create(card)
    return blocking, streaming


async def stream_start(http: httpx.AsyncClient, base: str) -> dict:
    _, streaming = await clients(http, base, "echo")
    task_id, seen = None, None
    async for event in streaming.send_message(SendMessageRequest(message=message("slow"))):
        kind = event.WhichOneof("payload")
        if kind == "task":
            task_id = event.task.id
        elif kind == "status_update":
            seen = event_seq(event)
            break  # the connection is dropped here, mid-task
    check(task_id is not None and seen is not None, "a task and a status update")
    return {"task_id": task_id, "seen": seen}


async def stream_resume(http: httpx.AsyncClient, base: str, task_id: str, after: int) -> dict:
    _, streaming = await clients(http, base, "echo")
    context = ClientCallContext(service_parameters={"Last-Event-ID": str(after)})
    kinds, states, seqs = [], [], []
    async for event in streaming.subscribe(SubscribeToTaskRequest(id=task_id), context=context):
        kind = event.WhichOneof("payload")
        kinds.append(kind)
        if kind == "status_update":
            states.append(TaskState.Name(event.status_update.status.state))
            seqs.append(event_seq(event))
    check(kinds[0] == "task", f"the task comes first: {kinds}")
    check(all(seq > after for seq in seqs), f"only events after {after}: {seqs}")
    check(seqs == sorted(seqs), f"in order: {seqs}")
    check(states and states[-1] == "TASK_STATE_COMPLETED", f"ends completed: {states}")
    check("artifact_update" in kinds, f"the result: {kinds}")
    return {"states": states, "seqs": seqs}


async def push(http: httpx.AsyncClient, base: str, webhook: str) -> dict:
    blocking, _ = await clients(http, base, "echo")
    request = SendMessageRequest(
        message=message("pushed"),
        configuration=SendMessageConfiguration(
            task_push_notification_config=TaskPushNotificationConfig(url=webhook, token="sdk-tok"),
        ),
    )
    task = None
    async for event in blocking.send_message(request):
        task = event.task
    check(task.status.state == TaskState.TASK_STATE_COMPLETED, f"pushed task: {task.status}")
    return {"task_id": task.id}


async def input_round_trip(http: httpx.AsyncClient, base: str) -> dict:
    blocking, _ = await clients(http, base, "asker")
    asked = None
    async for event in blocking.send_message(SendMessageRequest(message=message("translate"))):
        asked = event.task
    check(asked.status.state == TaskState.TASK_STATE_INPUT_REQUIRED, f"asks: {asked.status}")
    question = asked.status.message.parts[0].text
    answer = message("French", task_id=asked.id)
    done = None
    async for event in blocking.send_message(SendMessageRequest(message=answer)):
        done = event.task
    check(done.status.state == TaskState.TASK_STATE_COMPLETED, f"answered: {done.status}")
    return {"question": question, "result": done.artifacts[0].parts[0].text}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True, help="the gateway, e.g. http://127.0.0.1:9999")
    parser.add_argument("--token", required=True)
    parser.add_argument("--phase", default="all")
    parser.add_argument("--task")
    parser.add_argument("--after", type=int)
    parser.add_argument("--webhook")
    args = parser.parse_args()
    if args.phase != "all":
        async with httpx.AsyncClient(
            timeout=60, headers={"Authorization": f"Bearer {args.token}"}
        ) as http:
            if args.phase == "stream-start":
                seen = await stream_start(http, args.base)
            elif args.phase == "stream-resume":
                seen = await stream_resume(http, args.base, args.task, args.after)
            elif args.phase == "push":
                seen = await push(http, args.base, args.webhook)
            elif args.phase == "input":
                seen = await input_round_trip(http, args.base)
            else:
                check(False, f"unknown phase {args.phase}")
        print(json.dumps(seen))
        return
    seen: dict = {}

    async with httpx.AsyncClient(
        timeout=60, headers={"Authorization": f"Bearer {args.token}"}
    ) as http:
        card = await A2ACardResolver(http, f"{args.base}/agents/echo").get_agent_card()
        check(card.name == "echo", f"card name {card.name}")
        check(card.capabilities.streaming, "the card offers streaming")
        seen["card"] = card.name

        blocking = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
        streaming = ClientFactory(ClientConfig(httpx_client=http)).create(card)

        # Blocking: the finished task, its result as the artifact.
        task = None
        async for event in blocking.send_message(SendMessageRequest(message=message("hi"))):
            task = event.task
        check(task is not None and task.status.state == TaskState.TASK_STATE_COMPLETED,
              f"blocking send completes: {task}")
        check(task.artifacts[0].parts[0].text == "echo: hi", f"artifact {task.artifacts}")
        seen["blocking"] = TaskState.Name(task.status.state)

        # Non-blocking: answered before the work is done; GetTask sees it finish.
        later = None
        request = SendMessageRequest(
            message=message("later"),
            configuration=SendMessageConfiguration(return_immediately=True),
        )
        async for event in blocking.send_message(request):
            later = event.task
        check(later.status.state != TaskState.TASK_STATE_COMPLETED, "returned immediately")
        for _ in range(100):
            got = await blocking.get_task(GetTaskRequest(id=later.id))
            if got.status.state == TaskState.TASK_STATE_COMPLETED:
                break
            await asyncio.sleep(0.05)
        check(got.status.state == TaskState.TASK_STATE_COMPLETED, f"GetTask: {got.status}")
        seen["non_blocking"] = TaskState.Name(got.status.state)

        # Streaming: the task first, then its events in order, ending completed.
        kinds, states = [], []
        async for event in streaming.send_message(SendMessageRequest(message=message("slow"))):
            kind = event.WhichOneof("payload")
            kinds.append(kind)
            if kind == "status_update":
                states.append(TaskState.Name(event.status_update.status.state))
            elif kind == "artifact_update":
                check(event.artifact_update.artifact.parts[0].text == "echo: slow",
                      "streamed artifact")
        check(kinds[0] == "task", f"the task comes first: {kinds}")
        check("artifact_update" in kinds, f"the result is streamed: {kinds}")
        check(states[-1] == "TASK_STATE_COMPLETED", f"ends completed: {states}")
        order = ["TASK_STATE_SUBMITTED", "TASK_STATE_WORKING", "TASK_STATE_COMPLETED"]
        ranks = [order.index(state) for state in states]
        check(ranks == sorted(ranks), f"states in order: {states}")
        seen["stream"] = states

        listed = await blocking.list_tasks(ListTasksRequest(page_size=50))
        check(len(listed.tasks) >= 3, f"ListTasks: {len(listed.tasks)}")
        seen["listed"] = len(listed.tasks)

        # Cancel a task the sleeper never takes.
        sleeper_card = await A2ACardResolver(http, f"{args.base}/agents/sleeper").get_agent_card()
        sleeper = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(sleeper_card)
        waiting = None
        request = SendMessageRequest(
            message=message("never"),
            configuration=SendMessageConfiguration(return_immediately=True),
        )
        async for event in sleeper.send_message(request):
            waiting = event.task
        canceled = await sleeper.cancel_task(CancelTaskRequest(id=waiting.id))
        check(canceled.status.state == TaskState.TASK_STATE_CANCELED, f"cancel: {canceled.status}")
        seen["canceled"] = TaskState.Name(canceled.status.state)

    # Without a token: refused.
    async with httpx.AsyncClient(timeout=10) as anonymous:
        stranger = ClientFactory(ClientConfig(httpx_client=anonymous, streaming=False)).create(card)
        try:
            async for _ in stranger.send_message(SendMessageRequest(message=message("hi"))):
                pass
            check(False, "a request without a token was served")
        except Exception as err:  # the SDK raises its HTTP error type
            check("401" in str(err), f"refused with 401: {err!r}")
            seen["no_token"] = 401

    print(json.dumps(seen))


if __name__ == "__main__":
    asyncio.run(main())
