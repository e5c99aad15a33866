"""What an inbox hands out (docs/protocol.md §7, "The message"), with the answers that fit it,
and a handle on a task (§10)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from . import wire

if TYPE_CHECKING:
    from .agent import Agent
    from .serving import Serving

JSON = dict[str, Any]

#: The reserved agent id persons' answers and the people service's notices come from (§14).
PEOPLE_AGENT = "people"
#: The prefixes of a person (``person:alice``) and a role (``role:oncall``) (§14).
PERSON_PREFIX, ROLE_PREFIX = "person:", "role:"
# A valid person or role id: the prefix, then the agent-id rule.
_PARTY = re.compile(r"(?:person|role):[a-z0-9][a-z0-9_-]{0,63}")
# The notices that end an ask or an approval nobody answered (§14, "Timeout notice").
_TIMEOUTS = ("ask_timeout", "approval_expired")


def is_party(to: str) -> bool:
    """Whether ``to`` names a person or a role by its prefix (``person:…``, ``role:…``), valid
    or not: what :meth:`Agent.send` and the ``send_to_peer`` tool note instead of sending
    (the people service refuses an invalid one)."""
    return to.startswith((PERSON_PREFIX, ROLE_PREFIX))


class Message:
    """One inbox message. ``kind`` says what it is for: ``message`` (a peer speaking),
    ``request`` (a call waiting for your :meth:`reply`), ``response`` (the answer to a parked
    call of yours), ``notify`` (the fabric's notice, e.g. a call timed out), ``task`` (work
    given to you: :meth:`task`), ``task_update`` (a task you gave changed), ``receipt``."""

    def __init__(self, agent: "Agent", goal_id: str, entry: Mapping[str, Any]):
        self.agent, self.goal_id = agent, goal_id
        self.seq: int = entry["seq"]
        #: The message as it came (§7), a ``wire.InboxMessage`` (attributes; a dict too).
        self.raw: wire.InboxMessage = wire.InboxMessage(entry["message"])
        #: The sender's W3C trace context, carried on by every answer to this message.
        self.trace = {k: entry[k] for k in ("traceparent", "tracestate") if entry.get(k)}
        self.acked = False
        self._serving: "Serving | None" = None  # set when Agent.serve hands it out
        self._reject_reason: str | None = None

    async def ack(self) -> None:
        """Done with this message (and every earlier one of its goal): it is not handed out
        again (§7, ``ack``). ``messages()`` does this after your loop body returns. Under
        :meth:`Agent.serve` it does nothing: serve acknowledges in order once the handler
        returns (an ack of this one now could pass messages still being handled)."""
        if self._serving is not None or self.acked:
            return
        await self.agent._ack(self.goal_id, {"goal_id": self.goal_id, "through": self.seq})
        self.acked = True
        self.agent._done_through(self.goal_id, self.seq)

    async def reject(self, reason: str) -> None:
        """Gives up on this message: it goes to the dead letters with ``reason`` (§7, ``ack``
        with ``reject``; an operator lists them with ``switchboard dlq list`` and can replay
        one), and every earlier message of the goal counts as done. Under
        :meth:`Agent.serve` the reject is made in order, once the handler returns (and a
        handler that raises on a message that is neither a call nor a task is rejected this
        way by itself)."""
        if self._serving is not None:
            self._reject_reason = reason or "rejected"
            return
        if not self.acked:
            await self.agent._ack(self.goal_id, {"goal_id": self.goal_id, "seq": self.seq,
                                                 "reject": reason})
            self.acked = True
            self.agent._done_through(self.goal_id, self.seq)

    # The fields of §7, absent ones as their defaults.
    @property
    def id(self) -> str | None:
        return self.raw.get("id")

    @property
    def kind(self) -> str:
        return self.raw.get("kind", "message")

    @property
    def sender(self) -> str:
        """``from_agent_id``: who wrote it (for fabric notices, the agent they are about). A
        person's answer comes from the people service, ``"people"``: :attr:`from_person`
        names the person."""
        return self.raw["from_agent_id"]

    @property
    def from_person(self) -> str | None:
        """The person who wrote this answer (``"person:alice"``; also when the question went
        to a role), when the people service wrote it (§14, "How the answer arrives"):
        ``from_person`` of a message from the reserved id ``people``, if it is a valid person
        or role id. ``None`` for every other message, so no peer can speak as a person."""
        person = self.raw.get("from_person")
        if (self.sender == PEOPLE_AGENT and isinstance(person, str)
                and _PARTY.fullmatch(person)):
            return person
        return None

    def person_answer(self, item_id: str) -> Literal["answered", "timed_out"] | None:
        """How this message ends your ask or approval ``item_id`` (the ``item_id`` of
        :meth:`Agent.ask_person`'s or :meth:`Agent.request_approval`'s ``Parked``), if it does
        (§14, "Exactly one ending"): ``"answered"`` for the person's answer or decision
        (``kind: response``: :attr:`body` is the answer, :attr:`from_person` who gave it,
        :attr:`approved` the decision), ``"timed_out"`` for the notice that nobody answered by
        the deadline (``kind: notify``, ``metadata.switchboard`` ``ask_timeout`` or
        ``approval_expired``), ``None`` for any other message — an escalation notice
        (``metadata.switchboard`` ``escalated``) included: the ending still comes. Each ask
        and approval gets exactly one ending. Only the people service writes as ``people``,
        so a peer cannot forge one."""
        about = (self.correlation_id or "").lower()
        if self.sender != PEOPLE_AGENT or about != str(item_id).lower():
            return None
        if self.kind == "response":
            return "answered"
        if self.kind == "notify" and self.metadata.get("switchboard") in _TIMEOUTS:
            return "timed_out"
        return None

    @property
    def is_person_answer(self) -> bool:
        """A person's answer to one of your asks or approvals (``kind: response`` from the
        people service; ``correlation_id`` is the item's id, :attr:`from_person` the
        person). :meth:`person_answer` tells whether it is the one you wait for."""
        return (self.sender == PEOPLE_AGENT and self.kind == "response"
                and self.correlation_id is not None)

    @property
    def approved(self) -> bool:
        """For a person's decision on your approval: whether they approved it (then
        :meth:`Agent.use_approval` it, once, right before acting). ``False`` for a denial and
        for every other message."""
        people = self.metadata.get("people")
        return (self.is_person_answer and isinstance(people, Mapping)
                and people.get("decision") == "approved")

    @property
    def body(self) -> str:
        return self.raw.get("body", "")

    @property
    def parts(self) -> list[wire.Part]:
        """Its structured content: ``wire.PartText`` (``part.text``), ``wire.PartData``
        (``part.data``), ``wire.PartFile`` (``part.uri``), each a dict too."""
        return list(self.raw.get("parts", []))

    @property
    def attachments(self) -> list[wire.Attachment]:
        """The files it carries by reference (§17), each ``{name, media_type, size, sha256,
        ref}`` (attributes; a dict too): read one with :meth:`Agent.read_attachment` or
        :meth:`Agent.save_attachment`, or pass it on in a send's ``attachments``."""
        return [wire.Attachment(attachment) for attachment in self.raw.get("attachments", [])]

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
    def budget(self) -> JSON | None:
        """The cost budget of the work this message gives (§16, ``metadata.budget``): ``root``,
        ``work``, ``tokens``, ``cost`` granted; set only by Switchboard. Report spend with
        ``agent.spend(msg.budget, tokens=…, cost=…)``; calls and tasks made while serving this
        message draw on it (pass ``budget=msg.budget`` to draw on it from a task)."""
        budget = self.metadata.get("budget")
        return dict(budget) if isinstance(budget, dict) else None

    @property
    def call_deadline(self) -> str | None:
        """When a call expires (RFC 3339, §9 "Check the deadline before answering"): skip
        slow work whose answer cannot arrive in time."""
        return self.metadata.get("call_deadline")

    @property
    def error(self) -> wire.ReplyError | None:
        """A parked call's answer (``kind: response``) that is an error instead: a
        ``wire.ReplyError`` (``error.kind``, ``error.message``; the callee's handler raised,
        or it answered with ``reply_error``); ``None`` for a real answer.
        :meth:`raise_for_error` raises it as :class:`~switchboard.errors.CallFailed`."""
        if self.kind != "response":
            return None
        error = self.metadata.get("error")  # §9: a parked caller's failed answer
        return wire.ReplyError(error) if isinstance(error, Mapping) else None

    def raise_for_error(self) -> None:
        """Raises :class:`~switchboard.errors.CallFailed` when this is a call's answer that is
        an error (:attr:`error`); does nothing otherwise."""
        from .errors import CallFailed

        error = self.error
        if error is not None:
            raise CallFailed(str(error.kind or "unknown"), str(error.message or ""),
                             callee=self.sender,
                             answer={"correlation_id": self.correlation_id,
                                     "from_agent_id": self.sender, "body": self.body,
                                     "error": error})

    @property
    def part(self) -> int | None:
        """For a parked call's streamed answer: the part's number (1, 2, …) while
        ``metadata.partial``; ``None`` for the final answer and every other message."""
        meta = self.metadata
        return meta.get("part") if meta.get("partial") else None

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
    def _call_id(self) -> str:
        if not self.correlation_id:
            raise ValueError("only a call (kind request) takes a reply")
        return self.correlation_id

    async def reply(self, text: str, *, parts: Sequence[Mapping[str, Any]] = (),
                    attachments: Sequence[Any] = ()) -> "wire.ReplyAck":
        """Answers this call (§9): the final answer. Use it once per call; a second answer is
        a duplicate. After streamed parts its text is appended to theirs, and it may be
        empty (``reply("")``, the same as :meth:`end_stream`). ``attachments``: files by
        reference (§17, as :meth:`Agent.upload_file` returns them) the caller may read."""
        return await self.agent.reply(self._call_id(), text, parts=parts, trace=self.trace,
                                      attachments=attachments)

    async def reply_part(self, part: int, text: str, *,
                         parts: Sequence[Mapping[str, Any]] = (),
                         attachments: Sequence[Any] = ()) -> "wire.ReplyAck":
        """Part ``part`` of a streamed answer to this call, numbered **from 1** (1, 2, 3…; a
        retried number is taken once). The call stays open: end it with :meth:`end_stream`
        (nothing more to say) or :meth:`reply` (a last piece of text)."""
        return await self.agent.reply_part(self._call_id(), part, text, parts=parts,
                                           trace=self.trace, attachments=attachments)

    async def end_stream(self) -> "wire.ReplyAck":
        """Ends a streamed answer with no more text: the final answer is the parts joined
        (§9, "Streamed answers"; a final reply after parts may be empty)."""
        return await self.agent.reply(self._call_id(), "", trace=self.trace)

    async def reply_error(self, kind: str, text: str) -> "wire.ReplyAck":
        """Answers this call with an error instead of an answer: the caller's ``call``
        raises :class:`~switchboard.errors.CallFailed` (``kind``, ``text``). ``kind`` is
        1–64 characters of ``[a-z0-9_]`` (e.g. ``"bad_input"``, ``"not_supported"``),
        ``text`` at most 1024 characters. Ends the call, after parts too. A handler under
        :meth:`Agent.serve` that raises is answered this way with kind ``handler_error``."""
        return await self.agent.reply(self._call_id(), "", error={"kind": kind, "message": text},
                                      trace=self.trace)

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
    through its states (§10, "States and who may do what"). ``record`` is the task as last
    read, a ``wire.TaskRecord`` (``task.record.result_parts``, ``task.record.history``…)."""

    def __init__(self, agent: "Agent", record: Mapping[str, Any],
                 trace: Mapping[str, str] | None = None):
        self.agent, self.trace = agent, trace
        self.record: wire.TaskRecord = wire.TaskRecord(record)
        self.id: str = record["task_id"]

    @property
    def state(self) -> str | None:
        return self.record.get("state")

    @property
    def message(self) -> str:
        return self.record.get("message", "")

    @property
    def result(self) -> str | None:
        """What the assignee finished it with (``complete``'s text), once ``completed``;
        ``None`` before. The record's ``result_parts`` hold its parts. Read the task again
        (:meth:`refresh`) to see it change."""
        return self.record.get("result")

    @property
    def reason(self) -> str | None:
        """Why it was rejected, failed or canceled, once it was."""
        return self.record.get("reason")

    async def _op(self, op: str, text: str | None = None,
                  parts: Sequence[Mapping[str, Any]] = (),
                  attachments: Sequence[Any] = ()) -> "TaskHandle":
        self.record = await self.agent.task_op(op, self.id, text, parts=parts, trace=self.trace,
                                               attachments=attachments)
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
                       parts: Sequence[Mapping[str, Any]] = (),
                       attachments: Sequence[Any] = ()) -> "TaskHandle":
        """Tells the requester how it goes (a note and/or parts, and files: ``attachments``,
        each an attachment or a path, as on :meth:`Agent.send`)."""
        return await self._op("progress", note, parts, attachments)

    async def input_required(self, question: str) -> "TaskHandle":
        """Asks the requester; its answer comes as a message naming this task."""
        return await self._op("input_required", question)

    async def complete(self, result: str | None = None, *,
                       parts: Sequence[Mapping[str, Any]] = (),
                       attachments: Sequence[Any] = ()) -> "TaskHandle":
        """Finishes it with its result; ``attachments`` (attachments or paths) are its files,
        the record's ``result_attachments``, which the requester may read."""
        return await self._op("complete", result, parts, attachments)

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

    async def answer(self, text: str) -> wire.DeliveryReport:
        """(Requester) answers the assignee's question (``input_required``): a message to it
        naming the task (``metadata.task_id``), in reply to the task (§10: there is no answer
        op). Returns its ``wire.DeliveryReport``."""
        body: JSON = {"to": self.record["assignee"], "message": text, "id": str(uuid.uuid4()),
                      "metadata": {"task_id": self.id}}
        if self.agent.goal_id:
            body["from_goal_id"] = self.agent.goal_id
        if self.record.get("message_id"):
            body["in_reply_to"] = self.record["message_id"]
        return wire.parse(wire.DeliveryReport, await self.agent.request(
            f"agent.send.{self.agent.id}", body, trace=self.trace))
