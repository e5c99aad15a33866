"""What an inbox hands out (docs/protocol.md §7, "The message"), with the answers that fit it,
and a handle on a task (§10)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import wire
    from .agent import Agent

JSON = dict[str, Any]


class Message:
    """One inbox message. ``kind`` says what it is for: ``message`` (a peer speaking),
    ``request`` (a call waiting for your :meth:`reply`), ``response`` (the answer to a parked
    call of yours), ``notify`` (the fabric's notice, e.g. a call timed out), ``task`` (work
    given to you: :meth:`task`), ``task_update`` (a task you gave changed), ``receipt``."""

    def __init__(self, agent: "Agent", goal_id: str, entry: Mapping[str, Any]):
        self.agent, self.goal_id = agent, goal_id
        self.seq: int = entry["seq"]
        self.raw: JSON = dict(entry["message"])
        #: The sender's W3C trace context, carried on by every answer to this message.
        self.trace = {k: entry[k] for k in ("traceparent", "tracestate") if entry.get(k)}
        self.acked = False

    async def ack(self) -> None:
        """Done with this message (and every earlier one of its goal): it is not handed out
        again (§7, ``ack``). The inbox loop does this after your handler returns."""
        if not self.acked:
            await self.agent.request(f"agent.inbox.ack.{self.agent.id}",
                                     {"goal_id": self.goal_id, "through": self.seq})
            self.acked = True

    # The fields of §7, absent ones as their defaults.
    @property
    def id(self) -> str | None:
        return self.raw.get("id")

    @property
    def kind(self) -> str:
        return self.raw.get("kind", "message")

    @property
    def sender(self) -> str:
        """``from_agent_id``: who wrote it (for fabric notices, the agent they are about)."""
        return self.raw["from_agent_id"]

    @property
    def body(self) -> str:
        return self.raw.get("body", "")

    @property
    def parts(self) -> list[JSON]:
        return list(self.raw.get("parts", []))

    @property
    def metadata(self) -> JSON:
        return dict(self.raw.get("metadata", {}))

    @property
    def correlation_id(self) -> str | None:
        return self.raw.get("correlation_id")

    @property
    def in_reply_to(self) -> str | None:
        return self.raw.get("in_reply_to")

    @property
    def ttl(self) -> int | None:
        return self.raw.get("ttl")

    @property
    def call_deadline(self) -> str | None:
        """When a call expires (RFC 3339, §9 "Check the deadline before answering"): skip
        slow work whose answer cannot arrive in time."""
        return self.metadata.get("call_deadline")

    @property
    def is_call(self) -> bool:
        """A call waiting for an answer (§9, "Recognising a call")."""
        return (self.kind == "request" and bool(self.raw.get("expects_reply"))
                and self.correlation_id is not None)

    @property
    def task_id(self) -> str | None:
        """The task a ``task`` or ``task_update`` message is about; for a requester's answer
        to your question, the task it answers (``metadata.task_id``)."""
        task = self.raw.get("task")
        if isinstance(task, dict):
            return task.get("id")
        return self.metadata.get("task_id")

    @property
    def task_state(self) -> str | None:
        task = self.raw.get("task")
        return task.get("state") if isinstance(task, dict) else None

    def __repr__(self) -> str:
        return f"Message(kind={self.kind!r}, sender={self.sender!r}, body={self.body[:40]!r})"

    # Answers.
    async def reply(self, text: str, *, parts: Sequence[Mapping[str, Any]] = ()) -> "wire.ReplyAck":
        """Answers this call (§9). Use it once per call; a second answer is a duplicate."""
        if not self.correlation_id:
            raise ValueError("only a call (kind request) takes a reply")
        return await self.agent.reply(self.correlation_id, text, parts=parts, trace=self.trace)

    async def reply_part(self, part: int, text: str) -> "wire.ReplyAck":
        """Part ``part`` (1, 2, …) of a streamed answer to this call; finish with
        :meth:`reply`."""
        if not self.correlation_id:
            raise ValueError("only a call (kind request) takes a reply")
        return await self.agent.reply_part(self.correlation_id, part, text, trace=self.trace)

    async def ask_back(self, question: str, *, timeout_ms: int = 30_000) -> "wire.CallAnswer":
        """Asks the caller of this call a question and waits for its answer, without ending
        the call (§9, "Asking back inside a call"). Use it when the request is ambiguous."""
        return await self.agent.call(self.sender, question, timeout_ms=timeout_ms, serving=self)

    async def answer(self, text: str, **options: Any) -> "wire.DeliveryReport":
        """Answers a peer's message with a message of your own, threaded to this one and with
        its hop budget (§8, "Answering the sender")."""
        return await self.agent.send(self.sender, text, in_reply_to=self, **options)

    def task(self) -> "TaskHandle":
        """The task a ``kind: task`` message gives you, to accept, work and finish."""
        if self.task_id is None:
            raise ValueError("this message names no task")
        return TaskHandle(self.agent, {"task_id": self.task_id, "message": self.body,
                                       "parts": self.parts, "state": self.task_state,
                                       "message_id": self.id},
                          trace=self.trace)


class TaskHandle:
    """A task, from either side: the requester cancels it and reads it, the assignee moves it
    through its states (§10, "States and who may do what")."""

    def __init__(self, agent: "Agent", record: Mapping[str, Any],
                 trace: Mapping[str, str] | None = None):
        self.agent, self.record, self.trace = agent, dict(record), trace
        self.id: str = record["task_id"]

    @property
    def state(self) -> str | None:
        return self.record.get("state")

    @property
    def message(self) -> str:
        return self.record.get("message", "")

    async def _op(self, op: str, text: str | None = None,
                  parts: Sequence[Mapping[str, Any]] = ()) -> "TaskHandle":
        self.record = await self.agent.task_op(op, self.id, text, parts=parts, trace=self.trace)
        return self

    async def accept(self) -> "TaskHandle":
        """Takes the task into this goal (within ``max_concurrent_tasks``)."""
        return await self._op("accept")

    async def reject(self, reason: str) -> "TaskHandle":
        """Declines it, saying why."""
        return await self._op("reject", reason)

    async def start(self) -> "TaskHandle":
        """Starts, or resumes after a question was answered."""
        return await self._op("start")

    async def progress(self, note: str | None = None, *,
                       parts: Sequence[Mapping[str, Any]] = ()) -> "TaskHandle":
        """Tells the requester how it goes (a note and/or parts)."""
        return await self._op("progress", note, parts)

    async def input_required(self, question: str) -> "TaskHandle":
        """Asks the requester; its answer comes as a message naming this task."""
        return await self._op("input_required", question)

    async def complete(self, result: str | None = None, *,
                       parts: Sequence[Mapping[str, Any]] = ()) -> "TaskHandle":
        """Finishes it with its result."""
        return await self._op("complete", result, parts)

    async def fail(self, reason: str) -> "TaskHandle":
        """Gives up, saying why."""
        return await self._op("fail", reason)

    async def cancel(self, reason: str | None = None) -> "TaskHandle":
        """(Requester) stops it, and its open subtasks."""
        return await self._op("cancel", reason)

    async def refresh(self) -> "TaskHandle":
        """Reads it again."""
        self.record = await self.agent.get_task(self.id)
        return self

    async def spawn(self, to: str, text: str, **options: Any) -> "TaskHandle":
        """A subtask of this task (``to="self"`` keeps it)."""
        return await self.agent.spawn(self.id, to, text, **options)

    async def answer(self, text: str) -> JSON:
        """(Requester) answers the assignee's question (``input_required``): a message to it
        naming the task (``metadata.task_id``), in reply to the task (§10: there is no answer
        op)."""
        body: JSON = {"to": self.record["assignee"], "message": text, "id": str(uuid.uuid4()),
                      "metadata": {"task_id": self.id}}
        if self.agent.goal_id:
            body["from_goal_id"] = self.agent.goal_id
        if self.record.get("message_id"):
            body["in_reply_to"] = self.record["message_id"]
        return await self.agent.request(f"agent.send.{self.agent.id}", body, trace=self.trace)
