"""An agent on a Switchboard fabric (docs/protocol.md, the wire contract; every subject and body
below is described there, by section).

    async with await Agent.connect("nats://127.0.0.1:4222", "echo") as agent:
        async for message in agent.messages():
            if message.is_call:
                await message.reply(f"echo: {message.body}")

``connect`` registers the agent, opens a goal (its inbox) and keeps it online; leaving the
``async with`` closes the goal and deregisters it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Literal

import nats
from nats.errors import NoRespondersError

from . import wire
from .errors import SwitchboardError, Unavailable, error_for
from .message import Message, TaskHandle

JSON = dict[str, Any]
#: A message part (docs/protocol.md §7): {"type": "text"|"data"|"file", …}.
Part = Mapping[str, Any]

HEARTBEAT_EVERY_S = 10.0  # §4.2: one every 10 s keeps an agent online (offline after 30 s)
REQUEST_TIMEOUT_S = 10.0  # a send may retry a goal's delivery for up to 8 s (§8)
CALL_TIMEOUT_MS = 30_000  # §9: the correlator's default


def _trace_headers(trace: Mapping[str, str] | None) -> dict[str, str] | None:
    """W3C trace context for a request (§1 "Trace context"): the current OpenTelemetry span's
    when the API is installed and a span is recording, else the inbound message's."""
    try:
        from opentelemetry import propagate, trace as otel

        if otel.get_current_span().get_span_context().is_valid:
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            return carrier or None
    except ImportError:
        pass
    if trace:
        return {k: v for k, v in trace.items() if k in ("traceparent", "tracestate") and v}
    return None


class Agent:
    """One agent: its NATS connection, its card, its current goal. Build it with
    :meth:`connect`."""

    def __init__(self, nc: nats.NATS, agent_id: str, request_timeout: float):
        self.nc, self.id = nc, agent_id
        self.request_timeout = request_timeout
        self.goal_id: str | None = None
        self._beats: asyncio.Task | None = None
        self._closed = asyncio.Event()

    # ----------------------------------------------------------------------- the connection
    @classmethod
    async def connect(
        cls,
        nats_url: str | Sequence[str],
        agent_id: str,
        *,
        description: str = "",
        capabilities: Sequence[str] = (),
        card: Mapping[str, Any] | None = None,
        nkey_seed: str | None = None,
        goal_kind: Literal["interactive", "background", "daemon"] = "daemon",
        goal_id: str | None = None,
        open_goal: bool = True,
        request_timeout: float = REQUEST_TIMEOUT_S,
    ) -> "Agent":
        """Connects as ``agent_id``, registers its card (§4.1, §5), opens a goal (§4.4) and
        heartbeats every 10 s. ``nkey_seed`` signs in under the generated NATS accounts
        (``switchboard nats-config``; needs the ``nkeys`` extra); replies always arrive under
        ``_INBOX.<agent_id>``, the only inboxes those accounts let an agent read. ``goal_id``
        re-opens a goal this agent held before a restart, with what it still holds.

        Use it when an agent starts; ``async with`` it so the goal closes when it stops."""
        options: dict[str, Any] = {"name": f"switchboard-py-{agent_id}",
                                   "inbox_prefix": f"_INBOX.{agent_id}"}
        if nkey_seed:
            options["nkeys_seed_str"] = nkey_seed
        servers = [nats_url] if isinstance(nats_url, str) else list(nats_url)
        nc = await nats.connect(servers=servers, **options)
        agent = cls(nc, agent_id, request_timeout)
        body: JSON = {"description": description, "capabilities": list(capabilities)}
        body.update(card or {})
        try:
            await agent.request(f"agent.registry.register.{agent_id}", body)
            if open_goal:
                await agent.open_goal(goal_id=goal_id, kind=goal_kind)
        except BaseException:
            await nc.close()
            raise
        agent._beats = asyncio.create_task(agent._heartbeats())
        return agent

    async def __aenter__(self) -> "Agent":
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def close(self, deregister: bool = True, *, keep_goal: bool = False) -> None:
        """Closes the current goal (its inbox is purged, §4.5), deregisters (§4.3) and
        disconnects. ``keep_goal`` only disconnects: the goal keeps its messages for a restart
        (``connect(..., goal_id=…)``), and the directory marks the agent offline 30 s later.
        Safe to call twice; never raises over an error that is already on its way out."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._beats:
            self._beats.cancel()
        if not keep_goal:
            with contextlib.suppress(Exception):
                if self.goal_id:
                    await self.close_goal(self.goal_id)
                if deregister:
                    await self.request(f"agent.registry.deregister.{self.id}", {})
        with contextlib.suppress(Exception):
            await self.nc.close()

    @property
    def is_closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed.is_set()

    async def _heartbeats(self) -> None:
        while not self._closed.is_set():
            await asyncio.sleep(HEARTBEAT_EVERY_S)
            # A lost connection is nats-py's to restore; the next beat tries again.
            with contextlib.suppress(Exception):
                await self.request(f"agent.registry.heartbeat.{self.id}", {})

    async def request(self, subject: str, body: Mapping[str, Any], *,
                      trace: Mapping[str, str] | None = None,
                      timeout: float | None = None) -> JSON:
        """One request to a service (§1: JSON in, JSON out): the reply, or the error reply's
        exception (§2). The raw layer every other method uses."""
        try:
            msg = await self.nc.request(subject, json.dumps(body).encode(),
                                        timeout=timeout or self.request_timeout,
                                        headers=_trace_headers(trace))
        except NoRespondersError:
            raise Unavailable("no_responders", 503, f"no service answers on {subject}") from None
        except asyncio.TimeoutError:
            raise Unavailable("request_timeout", 504, f"no reply on {subject} in time") from None
        return _decode(subject, msg)

    # ----------------------------------------------------------------------- the directory
    async def open_goal(self, *, goal_id: str | None = None,
                        kind: str = "daemon", overflow: str | None = None) -> str:
        """Opens a goal: an inbox of its own, one run of work (§4.4). It becomes the current
        goal, where answers, parked calls and task updates land."""
        body: JSON = {"kind": kind}
        if goal_id:
            body["goal_id"] = goal_id
        if overflow:
            body["overflow"] = overflow
        reply = await self.request(f"agent.registry.goal.open.{self.id}", body)
        self.goal_id = reply["goal_id"]
        return reply["goal_id"]

    async def close_goal(self, goal_id: str) -> wire.GoalCloseReply:
        """Closes a goal and purges its inbox (§4.5)."""
        reply = await self.request(f"agent.registry.goal.close.{self.id}", {"goal_id": goal_id})
        if goal_id == self.goal_id:
            self.goal_id = None
        return reply

    async def list_peers(self, *, limit: int | None = None,
                         after: str | None = None) -> list[wire.PeerSummary]:
        """The agents this agent may reach, with their cards and status (§4.6): what an LLM
        looks at to choose whom to ask. Every page, unless ``limit`` asks for one page."""
        peers: list = []
        while True:
            body: JSON = {}
            if limit is not None:
                body["limit"] = limit
            if after is not None:
                body["after"] = after
            page = await self.request(f"agent.registry.peers.{self.id}", body)
            peers.extend(page["peers"])
            if limit is not None or not page.get("next"):
                return peers
            after = page["next"]

    async def lookup(self, agent_id: str) -> wire.LookupReply:
        """One agent's card, status and live goals (§4.7)."""
        return await self.request(f"agent.registry.lookup.{self.id}", {"agent_id": agent_id})

    # ----------------------------------------------------------------------- the inbox
    async def messages(self, *, goal_id: str | None = None, batch: int = 16,
                       wait_ms: int = 1000) -> AsyncIterator[Message]:
        """The goal's inbox as it fills (§7): fetched in batches, each held up to ``wait_ms``
        when nothing is unread. A message is acknowledged when the loop asks for the next one,
        after your handler returned: at least once, so a message whose handler raised (or a
        crash) hands it out again. Leaving the loop with ``break``? Call
        :meth:`Message.ack` first. Ends when the agent closes."""
        goal = goal_id or self.goal_id
        if goal is None:
            raise ValueError("no goal: open one first")
        while not self._closed.is_set():
            body: JSON = {"goal_id": goal, "max": batch, "wait_ms": wait_ms}
            try:
                page = await self.request(f"agent.inbox.fetch.{self.id}", body,
                                          timeout=self.request_timeout + wait_ms / 1000)
            except Exception:
                if self._closed.is_set():
                    return  # closed while a fetch was held: the loop just ends
                raise
            for entry in page["messages"]:
                message = Message(self, goal, entry)
                yield message
                await message.ack()  # the handler returned: done with it

    async def next_message(self, *, goal_id: str | None = None,
                           wait_ms: int = 5000) -> Message | None:
        """One message, acknowledged at once (``None`` when none came within ``wait_ms``):
        for a script that waits for one answer or update. It shares the goal's cursor with
        :meth:`messages`: do not use both on one goal at once."""
        goal = goal_id or self.goal_id
        page = await self.request(f"agent.inbox.fetch.{self.id}",
                                  {"goal_id": goal, "max": 1, "wait_ms": wait_ms},
                                  timeout=self.request_timeout + wait_ms / 1000)
        for entry in page["messages"]:
            message = Message(self, goal, entry)
            await message.ack()
            return message
        return None

    # ----------------------------------------------------------------------- messages
    def _addressed(self, to: str, text: str, parts: Sequence[Part],
                   metadata: Mapping[str, Any] | None, **fields: Any) -> JSON:
        """The body a send or a call shares: who to, the text, this goal, parts, metadata."""
        body: JSON = {"to": to, "message": text, **fields}
        if self.goal_id:
            body["from_goal_id"] = self.goal_id
        if parts:
            body["parts"] = list(parts)
        if metadata:
            body["metadata"] = dict(metadata)
        return body

    async def send(self, to: str, text: str, *, parts: Sequence[Part] = (),
                   metadata: Mapping[str, Any] | None = None,
                   receipt: Literal["delivered", "read"] | None = None,
                   in_reply_to: Message | None = None, message_id: str | None = None,
                   kind: str | None = None) -> wire.DeliveryReport:
        """send_to_peer (§8): fire-and-forget into every live goal of ``to``; the reply is the
        delivery report (``message_id``, ``delivered_to``, ``unreachable_reasons``). Use it
        to tell, not to ask (``call`` waits for an answer). ``receipt`` asks for ``delivered``
        or ``read`` receipts, back in this goal's inbox; ``in_reply_to`` threads the message
        and passes on its hop budget. The id is chosen here, so a retry is stored once."""
        body = self._addressed(to, text, parts, metadata,
                               id=message_id or str(uuid.uuid4()))
        if receipt:
            body["receipt"] = receipt
        if kind:
            body["kind"] = kind
        trace = None
        if in_reply_to is not None:
            body["in_reply_to"] = in_reply_to.id
            if in_reply_to.ttl is not None:
                body["ttl"] = in_reply_to.ttl
            trace = in_reply_to.trace
        return await self.request(f"agent.send.{self.id}", body, trace=trace)

    async def broadcast(self, text: str, **options: Any) -> wire.DeliveryReport:
        """A message to every agent this one may reach (§8, ``to: "*"``)."""
        return await self.send("*", text, **options)

    async def send_status(self, message_id: str) -> wire.SendStatusReply:
        """Where a message sent with a ``receipt`` is, per goal: stored, delivered, read,
        expired_unread (§8, Receipts)."""
        return await self.request(f"agent.send.status.{self.id}", {"message_id": message_id})

    # ----------------------------------------------------------------------- calls
    def _call_body(self, to: str, text: str, timeout_ms: int, parts: Sequence[Part],
                   metadata: Mapping[str, Any] | None, serving: Message | None,
                   correlation_id: str | None = None) -> JSON:
        body = self._addressed(to, text, parts, metadata, timeout_ms=timeout_ms,
                               correlation_id=correlation_id or str(uuid.uuid4()))
        if serving is not None:
            if serving.correlation_id:  # a call made while answering one (§9, the chain)
                body["parent_correlation_id"] = serving.correlation_id
            body["in_reply_to"] = serving.id
        return body

    async def call(self, to: str, text: str, *, timeout_ms: int = CALL_TIMEOUT_MS,
                   parts: Sequence[Part] = (), metadata: Mapping[str, Any] | None = None,
                   serving: Message | None = None,
                   correlation_id: str | None = None) -> wire.CallAnswer:
        """Asks ``to`` and waits for the answer (§9): the ``CallAnswer`` (``body``, ``parts``).
        Use it when the next step needs the answer. ``serving`` is the call this one is made
        while answering: its deadline bounds this one and cycles are refused. Raises
        :class:`~switchboard.errors.CallTimeout` when nobody answers in time. After
        :class:`~switchboard.errors.Unavailable`, send it again with the same
        ``correlation_id``: the retry joins the first call instead of asking twice."""
        body = self._call_body(to, text, timeout_ms, parts, metadata, serving, correlation_id)
        return await self.request(f"agent.call.{self.id}", body,
                                  trace=serving.trace if serving else None,
                                  timeout=timeout_ms / 1000 + self.request_timeout)

    async def call_parked(self, to: str, text: str, *, timeout_ms: int = CALL_TIMEOUT_MS,
                          parts: Sequence[Part] = (),
                          metadata: Mapping[str, Any] | None = None,
                          serving: Message | None = None,
                          correlation_id: str | None = None) -> wire.CallParked:
        """Asks ``to`` without waiting (§9, ``wait: false``): ``CallParked`` at once; the
        answer (``kind: response``) or a timeout notice (``kind: notify``) lands in this goal's
        inbox later. Use it to ask several agents at once, or when the agent has other work."""
        body = self._call_body(to, text, timeout_ms, parts, metadata, serving, correlation_id)
        body["wait"] = False
        return await self.request(f"agent.call.{self.id}", body,
                                  trace=serving.trace if serving else None)

    async def call_stream(self, to: str, text: str, *, timeout_ms: int = CALL_TIMEOUT_MS,
                          parts: Sequence[Part] = (),
                          metadata: Mapping[str, Any] | None = None,
                          serving: Message | None = None,
                          correlation_id: str | None = None,
                          ) -> AsyncIterator[wire.CallPart | wire.CallAnswer]:
        """Asks ``to`` and yields its answer as it comes (§9, "Streamed answers"): each
        ``CallPart`` (``partial: true``, numbered 1, 2, …) in order, then the final
        ``CallAnswer``, whose ``body`` is everything joined. Parts lost in a reconnect are
        read back. Use it to show a long answer while it is written."""
        body = self._call_body(to, text, timeout_ms, parts, metadata, serving, correlation_id)
        body["stream"] = True
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox)
        correlation_id, next_part = body["correlation_id"], 1
        deadline = asyncio.get_running_loop().time() + timeout_ms / 1000 + self.request_timeout
        try:
            await self.nc.publish(f"agent.call.{self.id}", json.dumps(body).encode(),
                                  reply=inbox,
                                  headers=_trace_headers(serving.trace if serving else None))
            while True:
                left = deadline - asyncio.get_running_loop().time()
                try:
                    msg = await sub.next_msg(timeout=max(left, 0.001))
                except nats.errors.TimeoutError:
                    back = await self._parts_after(correlation_id, next_part - 1)
                    for part in back.get("parts", []):
                        if part["part"] == next_part:
                            next_part += 1
                            yield part
                    if back.get("answer"):
                        yield back["answer"]
                        return
                    raise error_for("timeout", 504,
                                    f"no answer from `{to}` within {timeout_ms} ms") from None
                reply = _decode(f"agent.call.{self.id}", msg)
                if reply.get("partial"):
                    if reply["part"] > next_part:  # a gap: read back what is missing
                        back = await self._parts_after(correlation_id, next_part - 1)
                        for part in back.get("parts", []):
                            if part["part"] == next_part:
                                next_part += 1
                                yield part
                    if reply["part"] == next_part:
                        next_part += 1
                        yield reply
                    continue
                if reply.get("streamed", 0) >= next_part:  # parts that never arrived
                    back = await self._parts_after(correlation_id, next_part - 1)
                    for part in back.get("parts", []):
                        if part["part"] == next_part:
                            next_part += 1
                            yield part
                yield reply
                return
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _parts_after(self, correlation_id: str, after: int) -> wire.CallParts:
        return await self.request(f"agent.calls.parts.{self.id}",
                                  {"correlation_id": correlation_id, "after": after})

    async def reply(self, correlation_id: str, text: str, *, parts: Sequence[Part] = (),
                    trace: Mapping[str, str] | None = None) -> wire.ReplyAck:
        """reply_to_peer (§9): answers the call ``correlation_id``; the ``ReplyAck`` says
        where the answer went. A repeat is ``duplicate: true`` and sends nothing."""
        body: JSON = {"correlation_id": correlation_id, "message": text}
        if parts:
            body["parts"] = list(parts)
        return await self.request(f"agent.reply.{self.id}", body, trace=trace)

    async def reply_part(self, correlation_id: str, part: int, text: str, *,
                         parts: Sequence[Part] = (),
                         trace: Mapping[str, str] | None = None) -> wire.ReplyAck:
        """Part ``part`` (1, 2, …) of a streamed answer (§9): the call stays open until
        :meth:`reply` sends the final part. Numbered, so a retry is taken once."""
        body: JSON = {"correlation_id": correlation_id, "message": text, "partial": True,
                      "part": part}
        if parts:
            body["parts"] = list(parts)
        return await self.request(f"agent.reply.{self.id}", body, trace=trace)

    async def pending_calls(self) -> wire.PendingCalls:
        """This agent's open calls, ``outgoing`` and ``incoming`` (§9)."""
        return await self.request(f"agent.calls.pending.{self.id}", {})

    # ----------------------------------------------------------------------- tasks
    async def create_task(self, to: str, text: str, *, parts: Sequence[Part] = (),
                          deadline_in_ms: int | None = None, task_id: str | None = None,
                          metadata: Mapping[str, Any] | None = None,
                          callback: Mapping[str, Any] | None = None,
                          in_reply_to: Message | None = None) -> TaskHandle:
        """Hands ``to`` a piece of work with a state, followed to its end (§10): use a task,
        not a call, for work that takes long, may ask questions, or splits into subtasks.
        Updates (``kind: task_update``) come to this goal. The id is chosen here, so a retry
        is recognised."""
        body = self._task_body(to, text, parts, deadline_in_ms, task_id, metadata, callback,
                               in_reply_to)
        reply = await self.request(f"agent.task.create.{self.id}", body,
                                   trace=in_reply_to.trace if in_reply_to else None)
        return TaskHandle(self, reply["task"])

    async def spawn(self, parent_task_id: str, to: str, text: str, **options: Any) -> TaskHandle:
        """A subtask of the task this agent is working on (§10, Subtasks); ``to="self"`` keeps
        it. Canceling or ending the parent cancels it."""
        body = self._task_body(to, text, options.get("parts", ()),
                               options.get("deadline_in_ms"), options.get("task_id"),
                               options.get("metadata"), options.get("callback"), None)
        body["parent_task_id"] = parent_task_id
        reply = await self.request(f"agent.task.spawn.{self.id}", body)
        return TaskHandle(self, reply["task"])

    def _task_body(self, to, text, parts, deadline_in_ms, task_id, metadata, callback,
                   in_reply_to) -> JSON:
        body: JSON = {"to": to, "message": text, "task_id": task_id or str(uuid.uuid4())}
        if self.goal_id:
            body["from_goal_id"] = self.goal_id
        if parts:
            body["parts"] = list(parts)
        if deadline_in_ms is not None:
            body["deadline_in_ms"] = deadline_in_ms
        if metadata:
            body["metadata"] = dict(metadata)
        if callback:
            body["callback"] = dict(callback)
        if in_reply_to is not None:
            body["in_reply_to"] = in_reply_to.id
        return body

    async def task_op(self, op: str, task_id: str, text: str | None = None, *,
                      parts: Sequence[Part] = (),
                      trace: Mapping[str, str] | None = None) -> wire.TaskRecord:
        """One transition (§10): ``accept``, ``reject``, ``start``, ``progress``,
        ``input_required``, ``complete``, ``fail`` or ``cancel``; the task after it."""
        body: JSON = {"task_id": task_id}
        if text is not None:
            body["message"] = text
        if parts:
            body["parts"] = list(parts)
        if op == "accept" and self.goal_id:
            body["from_goal_id"] = self.goal_id
        return (await self.request(f"agent.task.{op}.{self.id}", body, trace=trace))["task"]

    async def get_task(self, task_id: str) -> wire.TaskRecord:
        """A task this agent is a party of, as stored (§10)."""
        return (await self.request(f"agent.task.get.{self.id}", {"task_id": task_id}))["task"]

    async def list_tasks(self, **filters: Any) -> wire.TaskList:
        """This agent's tasks (§10): ``role``, ``state``, ``parent``, ``peer``, ``limit``,
        ``cursor``, ``newest_first``; ``{tasks, next_cursor?, total?}``."""
        return await self.request(f"agent.task.list.{self.id}", filters)

    async def cancel_task(self, task_id: str, reason: str | None = None) -> wire.TaskRecord:
        """Cancels a task this agent gave, and its open subtasks (§10)."""
        return await self.task_op("cancel", task_id, reason)


def _decode(subject: str, msg: Any) -> JSON:
    """A reply's body, or the exception of its error (§2: the micro error headers and a
    top-level ``error`` object). A status message with no body and status 503 is NATS saying
    nobody serves the subject (what a stream's reply subject gets)."""
    if not msg.data and (msg.headers or {}).get("Status") == "503":
        raise Unavailable("no_responders", 503, f"no service answers on {subject}")
    try:
        data = json.loads(msg.data or b"{}")
    except ValueError:
        raise error_for("internal", 502, f"the reply on {subject} is not JSON") from None
    headers = msg.headers or {}
    if isinstance(data, dict) and ("error" in data or "Nats-Service-Error-Code" in headers):
        err = data.get("error") or {}
        code = err.get("code") or headers.get("Nats-Service-Error-Code") or 500
        raise error_for(err.get("kind", "unknown"), int(code),
                        err.get("message", headers.get("Nats-Service-Error", "")))
    return data
