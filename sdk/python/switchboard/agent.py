"""An agent on a Switchboard fabric (docs/protocol.md, the wire contract; every subject and body
below is described there, by section).

    async def handle(message):
        if message.is_call:
            await message.reply(f"echo: {message.body}")

    async with await Agent.connect("nats://127.0.0.1:4222", "echo") as agent:
        await agent.serve(handle)          # until SIGTERM/SIGINT or agent.stop()

``connect`` registers the agent, opens its goal (its inbox; named ``"main"`` unless told
otherwise, so a restarted agent finds what was sent while it was down) and keeps it online.
A graceful stop, or leaving the ``async with`` normally, closes the goal and deregisters;
leaving it because of an exception only disconnects, and keeps the goal for the restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import mimetypes
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any, Literal

import nats
from nats.errors import NoRespondersError

from . import files, wire
from .connection import nats_options
from .errors import CallFailed, SwitchboardError, Unavailable, error_for
from .message import Message, TaskHandle, is_party
from .serving import ERROR_MESSAGE_MAX, Handler, Serving, default_signals
from .tools import Toolbox

JSON = dict[str, Any]


def call_id() -> str:
    """A new call id: a UUIDv7 (RFC 9562), its first 48 bits the time in milliseconds. A call
    whose id was made moments ago has its record opened beside its request's delivery
    (docs/protocol.md §9, "Call ids"); any other id still works, one round trip slower."""
    value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10), "big")
    value = value & ~(0xF << 76) | 0x7 << 76  # version 7
    value = value & ~(0x3 << 62) | 0x2 << 62  # the RFC 9562 variant
    return str(uuid.UUID(int=value))

#: A message part (docs/protocol.md §7): {"type": "text"|"data"|"file", …}.
Part = Mapping[str, Any]

HEARTBEAT_EVERY_S = 10.0  # §4.2: one every 10 s keeps an agent online (offline after 30 s)
REQUEST_TIMEOUT_S = 10.0  # a send may retry a goal's delivery for up to 8 s (§8)
CALL_TIMEOUT_MS = 30_000  # §9: the correlator's default
DEFAULT_GOAL = "main"  # the goal name connect opens unless told otherwise (§4.4, `name`)
_STOP_SIGNALS = object()  # serve()'s default: SIGTERM and SIGINT
ACK_ATTEMPTS = 5  # an ack is sent again while no inbox service answers (it is idempotent)
#: How long past its ``wait_ms`` a fetch's reply (or an ack's) may take before the reader stops
#: waiting for it and sends it again: the inbox replica holding it may have gone away. A fetch
#: or an ack is milliseconds of work; a reader that waited out the whole request timeout
#: (10 s) after each replica kill would fall behind its goal.
INBOX_ATTEMPT_S = 2.0
FETCH_ATTEMPTS = 5  # a fetch is sent again (without waiting) while no inbox service answers


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
        #: The name the current goal was opened by (``None`` for a goal opened by id).
        self.goal_name: str | None = None
        self._beats: asyncio.Task | None = None
        self._closed = asyncio.Event()
        # Per goal, the highest sequence this agent acknowledged: hand-out is at least once
        # (§7), so a message at or below it that comes again is a repeat, dropped here.
        self._acked: dict[str, int] = {}
        self._serving: Serving | None = None
        self._toolbox: Toolbox | None = None

    # ----------------------------------------------------------------------- the connection
    @classmethod
    async def connect(
        cls,
        nats_url: str | Sequence[str] | None = None,
        agent_id: str | None = None,
        *,
        description: str = "",
        capabilities: Sequence[str] = (),
        card: Mapping[str, Any] | None = None,
        nkey_seed: str | os.PathLike[str] | None = None,
        creds: str | os.PathLike[str] | None = None,
        context: str | None = None,
        goal: str | None = DEFAULT_GOAL,
        goal_kind: Literal["interactive", "background", "daemon"] = "daemon",
        goal_id: str | None = None,
        open_goal: bool = True,
        request_timeout: float = REQUEST_TIMEOUT_S,
    ) -> "Agent":
        """Connects as ``agent_id``, registers its card (§4.1, §5), opens its goal (§4.4) and
        heartbeats every 10 s. Replies always arrive under ``_INBOX.<agent_id>``, the only
        inboxes the generated NATS accounts let an agent read.

        Signing in, as NATS users do (:mod:`switchboard.connection`): ``nkey_seed`` is an NKey
        seed file (``switchboard nats-config`` writes ``agents/<agent_id>.nk``) or the seed
        itself; ``creds`` a NATS credentials file (``user.creds``); both need the ``nkeys``
        extra. ``context`` names a NATS CLI context (``~/.config/nats/context/<name>.json``,
        under ``$XDG_CONFIG_HOME`` when set): its ``url`` (then ``nats_url`` may be left
        out), ``creds``, ``nkey``, ``user``/``password``, ``token`` and TLS files. A URL,
        ``creds`` or ``nkey_seed`` given here win over the context's. With neither a URL nor
        ``context``, the context ``$NATS_CONTEXT`` names is used. A setting that cannot be
        used (no such context, a missing file) raises
        :class:`~switchboard.connection.ConfigError` (a ``ValueError``) before connecting.

        ``goal`` names the goal (1–64 characters of ``[a-z0-9_.-]``, default ``"main"``): the
        directory derives the goal's id from the agent and the name, so the same name is the
        same goal, re-opened as it was. A restarted agent therefore reads what was sent while
        it was down, and a restart never leaves a second live goal behind. Two processes of
        one agent that use the same name **share one goal** (both read the same messages, and
        an ack by one moves the cursor for both): give each worker its own name
        (``goal="worker-1"``), and each gets every send to the agent. ``goal=None`` opens a
        fresh goal with a minted id (the old behaviour: a goal nobody finds again after a
        restart). ``goal_id`` re-opens a goal by its id instead (it wins over ``goal``).

        Use it when an agent starts; ``async with`` it: a normal exit closes the goal and
        deregisters, an exception only disconnects (the goal and its messages wait for the
        restart)."""
        if not agent_id:
            raise TypeError("Agent.connect needs agent_id")
        servers, sign_in = nats_options(nats_url, creds=creds, nkey_seed=nkey_seed,
                                        context=context)
        options: dict[str, Any] = {"name": f"switchboard-py-{agent_id}",
                                   "inbox_prefix": f"_INBOX.{agent_id}", **sign_in}
        nc = await nats.connect(servers=servers, **options)
        agent = cls(nc, agent_id, request_timeout)
        body: JSON = {"description": description, "capabilities": list(capabilities)}
        body.update(card or {})
        try:
            await agent.request(f"agent.registry.register.{agent_id}", body)
            if open_goal:
                await agent.open_goal(goal_id=goal_id, name=None if goal_id else goal,
                                      kind=goal_kind)
        except BaseException:
            await nc.close()
            raise
        agent._beats = asyncio.create_task(agent._heartbeats())
        return agent

    async def __aenter__(self) -> "Agent":
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *_exc: object) -> None:
        # Only a clean exit closes the goal. An exception (a handler's, a cancellation,
        # Ctrl-C on a messages() loop) is a crash: disconnect, and keep the goal and what it
        # holds for the restart, which re-opens it by its name.
        await self.close(keep_goal=exc_type is not None)

    async def close(self, deregister: bool = True, *, keep_goal: bool = False) -> None:
        """Closes the current goal (its inbox is purged, §4.5), deregisters (§4.3) and
        disconnects, at once: a ``serve`` loop ends and its handlers in progress are
        cancelled (:meth:`stop` lets them finish first). ``keep_goal`` only disconnects: the
        goal keeps its messages for a restart (``connect`` with the same ``goal`` name), and
        the directory marks the agent offline 30 s later. Safe to call twice; never raises
        over an error that is already on its way out."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._beats:
            self._beats.cancel()
        if self._serving is not None:
            self._serving.request_stop()  # it sees the agent closed: ends, cancels handlers
        # Shielded: a close made from a handler goes on when serve cancels that handler.
        await asyncio.shield(self._shut(deregister, keep_goal))

    async def _shut(self, deregister: bool, keep_goal: bool) -> None:
        if not keep_goal:
            with contextlib.suppress(Exception):
                if self.goal_id:
                    await self.close_goal(self.goal_id)
                if deregister:
                    await self.request(f"agent.registry.deregister.{self.id}", {})
        with contextlib.suppress(Exception):
            await self.nc.close()

    @property
    def tools(self) -> Toolbox:
        """The fabric as function-calling tools for an LLM, bound to this agent (the same
        :class:`~switchboard.tools.Toolbox` each time): ``tools.openai()`` and
        ``tools.anthropic()`` are the 17 tools of ``switchboard mcp`` in those formats, and
        ``await tools.run(call)`` runs a model's tool call as this agent and returns the
        result message to append to the conversation."""
        if self._toolbox is None:
            self._toolbox = Toolbox(self)
        return self._toolbox

    @property
    def is_closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed.is_set()

    async def stop(self) -> None:
        """The graceful stop: a :meth:`serve` loop takes no new message, lets the handlers in
        progress finish and acknowledges them, then the goal is closed and the agent
        deregistered. Without a ``serve`` loop, the same as :meth:`close`. Called from inside a
        handler it only asks for the stop (the loop ends once that handler returns)."""
        serving = self._serving
        if serving is None:
            await self.close()
            return
        serving.request_stop()
        if asyncio.current_task() in serving.tasks:
            return  # a handler stopping its own loop: it cannot wait for itself
        await serving.finished.wait()
        await self.close()

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
    async def open_goal(self, *, name: str | None = None, goal_id: str | None = None,
                        kind: str = "daemon", overflow: str | None = None) -> str:
        """Opens a goal: an inbox of its own, one run of work (§4.4). It becomes the current
        goal, where answers, parked calls and task updates land. ``name`` (1–64 characters of
        ``[a-z0-9_.-]``) opens the goal of that name, the same one every time (re-opening it
        keeps its unread messages); ``goal_id`` re-opens a goal by id; neither mints a fresh
        goal. Returns the goal id."""
        if name is not None and goal_id is not None:
            raise ValueError("open a goal by name or by goal_id, not both")
        body: JSON = {"kind": kind}
        if goal_id:
            body["goal_id"] = goal_id
        if name is not None:
            body["name"] = name
        if overflow:
            body["overflow"] = overflow
        reply = await self.request(f"agent.registry.goal.open.{self.id}", body)
        self.goal_id, self.goal_name = reply["goal_id"], name
        return reply["goal_id"]

    async def close_goal(self, goal_id: str) -> wire.GoalCloseReply:
        """Closes a goal and purges its inbox (§4.5)."""
        reply = await self.request(f"agent.registry.goal.close.{self.id}", {"goal_id": goal_id})
        if goal_id == self.goal_id:
            self.goal_id = self.goal_name = None
        return wire.parse(wire.GoalCloseReply, reply)

    async def list_peers(self, *, limit: int | None = None,
                         after: str | None = None) -> list[wire.PeerSummary]:
        """Every other registered agent, with its card and status (§4.6): what an LLM looks
        at to choose whom to ask. Each peer is a ``wire.PeerSummary`` (attributes; a dict
        too): ``agent_id``, ``description``, ``capabilities``, ``status`` (``"idle"``,
        ``"busy"`` or ``"offline"``: offline agents are listed too) and ``reachable`` (you may
        message it and it has a live goal; an offline agent with a goal is reachable, its
        messages wait). Every page, unless ``limit`` asks for one page."""
        peers: list[wire.PeerSummary] = []
        while True:
            body: JSON = {}
            if limit is not None:
                body["limit"] = limit
            if after is not None:
                body["after"] = after
            page = wire.parse(wire.PeersReply,
                              await self.request(f"agent.registry.peers.{self.id}", body))
            peers.extend(page.peers)
            if limit is not None or not page.next:
                return peers
            after = page.next

    async def lookup(self, agent_id: str) -> wire.LookupReply:
        """One agent's card, status and live goals (§4.7): a ``wire.LookupReply``
        (``reply.card.description``, ``reply.status``, ``reply.live_goals``)."""
        return wire.parse(wire.LookupReply, await self.request(
            f"agent.registry.lookup.{self.id}", {"agent_id": agent_id}))

    # ----------------------------------------------------------------------- the inbox
    async def messages(self, *, goal_id: str | None = None, batch: int = 16,
                       wait_ms: int = 1000) -> AsyncIterator[Message]:
        """The goal's inbox as it fills (§7), one message at a time: fetched in batches, each
        held up to ``wait_ms`` when nothing is unread. A message is acknowledged when the loop
        asks for the next one, after your loop body finished with it. If the body raises, the
        message is **not** acknowledged: the exception leaves the loop (and an ``async with
        Agent`` around it keeps the goal), and the message is handed out again by the next
        read, after a restart too. Leaving the loop with ``break``? Call :meth:`Message.ack`
        first. Ends when the agent closes.

        For a long-running agent prefer :meth:`serve`: a raising handler answers its caller
        with an error and the loop goes on, handlers may run concurrently, and SIGTERM stops
        it gracefully."""
        goal = goal_id or self.goal_id
        if goal is None:
            raise ValueError("no goal: open one first")
        while not self._closed.is_set():
            body: JSON = {"goal_id": goal, "max": batch, "wait_ms": wait_ms}
            try:
                page = await self._fetch(body)
            except Exception:
                if self._closed.is_set():
                    return  # closed while a fetch was held: the loop just ends
                raise
            for entry in page["messages"]:
                if self._is_repeat(goal, entry):
                    continue
                message = Message(self, goal, entry)
                yield message
                await message.ack()  # the handler returned: done with it

    async def serve(self, handler: Handler, *, max_concurrent: int = 1,
                    stop_signals: Iterable[int] | None | object = _STOP_SIGNALS,
                    goal_id: str | None = None, batch: int = 16, wait_ms: int = 1000) -> None:
        """Runs ``handler(message)`` (a coroutine function, or a plain function) on every
        message of the goal's inbox until the agent stops; the crash-safe way to serve.

        - **A handler that raises never loses its message, and serving goes on.** A call is
          answered at once with ``error = {"kind": "handler_error", "message": <the
          exception's text, at most 1024 characters>}``: its caller's ``call`` raises
          :class:`~switchboard.errors.CallFailed` instead of waiting for the deadline. A
          task (``kind: task``) is ended for its requester with the exception's text as the
          reason: ``rejected`` while still ``submitted``, ``failed`` once this goal accepted
          it (started first if need be), left alone if it has ended already; the message is
          then acknowledged. Any other message, and a task that cannot be ended (gone, held
          by another goal, refused), is rejected into the dead letters (§7, ``ack`` with
          ``reject``) with the exception's text as the reason (``switchboard dlq list`` shows
          it, ``switchboard dlq replay`` puts it back). The exception is logged (logger
          ``switchboard``).
        - **Up to ``max_concurrent`` handlers run at once**, and acknowledgements stay
          cumulative and correct: the goal's cursor moves through a message only when it and
          every message before it are done, so a crash hands out again what was not finished.
          Do not call ``message.ack()`` in a handler (it does nothing here); ``await
          message.reject(reason)`` gives a message up on purpose.
        - **A graceful stop** on any of ``stop_signals`` (default SIGTERM and SIGINT; ``()``
          installs none) or :meth:`stop`: no new message is started, the handlers in progress
          finish and are acknowledged, then the goal is closed and the agent deregistered, and
          ``serve`` returns. An idle loop does not wait out its held read (``wait_ms``): the
          read is dropped and the stop takes only the goal's close and the deregistration. A
          second signal stops at once: the handlers still running are cancelled,
          unacknowledged, and the goal is kept (as after a crash). Signals are handled only on
          the main thread's event loop (elsewhere, call :meth:`stop`).

        A handler that returns without answering a call leaves its caller waiting until the
        call's deadline: answer every call (``reply``, ``end_stream`` or ``reply_error``).
        ``serve`` raises (and keeps the goal) only when reading the inbox fails for good, e.g.
        the goal was closed under it; while the fabric is unavailable it retries."""
        goal = goal_id or self.goal_id
        if goal is None:
            raise ValueError("no goal: open one first")
        if self._serving is not None and not self._serving.finished.is_set():
            raise RuntimeError("this agent is serving already")
        signals = default_signals() if stop_signals is _STOP_SIGNALS else tuple(stop_signals or ())
        serving = Serving(self, goal, handler, max_concurrent=max_concurrent, batch=batch,
                          wait_ms=wait_ms)
        self._serving = serving
        await serving.run(signals)

    async def next_message(self, *, goal_id: str | None = None,
                           wait_ms: int = 5000) -> Message | None:
        """One message, acknowledged at once (``None`` when none came within ``wait_ms``):
        for a script that waits for one answer or update. It shares the goal's cursor with
        :meth:`messages`: do not use both on one goal at once."""
        goal = goal_id or self.goal_id
        page = await self._fetch({"goal_id": goal, "max": 1, "wait_ms": wait_ms})
        for entry in page["messages"]:
            if self._is_repeat(goal, entry):
                continue
            message = Message(self, goal, entry)
            await message.ack()
            return message
        return None

    def _is_repeat(self, goal: str, entry: JSON) -> bool:
        """Whether ``entry`` was acknowledged already: handed out again (hand-out is at least
        once, §7), never shown twice."""
        return entry["seq"] <= self._acked.get(goal, 0)

    async def _ack(self, goal: str, body: JSON) -> JSON:
        """An ack (§7), sent again while no inbox service answers: acks are idempotent (through
        a sequence already passed moves nothing), so a reader whose service replica went away
        does not hand its message out again for want of one."""
        pause = 0.1
        timeout = self._inbox_attempt_s
        for _ in range(ACK_ATTEMPTS - 1):
            try:
                return await self.request(f"agent.inbox.ack.{self.id}", body, timeout=timeout)
            except Unavailable:
                if self._closed.is_set():
                    raise
                await asyncio.sleep(pause)
                pause *= 2
        return await self.request(f"agent.inbox.ack.{self.id}", body, timeout=timeout)

    @property
    def _inbox_attempt_s(self) -> float:
        """How long one fetch (past its wait) or ack waits for its reply: :data:`INBOX_ATTEMPT_S`,
        or the request timeout if shorter."""
        return min(INBOX_ATTEMPT_S, self.request_timeout)

    async def _fetch(self, body: JSON) -> JSON:
        """A fetch (§7), sent again while no inbox service answers. One held by a replica that
        went away gets no reply: after its ``wait_ms`` and :data:`INBOX_ATTEMPT_S` more it is
        sent again, without waiting, so a stopped replica costs the reader about two seconds,
        not the request timeout. Never two copies at once: each copy that reaches a replica
        counts as a hand-out of the oldest unread message towards its redelivery limit."""
        pause = 0.1
        for attempt in range(1, FETCH_ATTEMPTS + 1):
            timeout = self._inbox_attempt_s + body.get("wait_ms", 0) / 1000
            try:
                return await self.request(f"agent.inbox.fetch.{self.id}", body, timeout=timeout)
            except Unavailable:
                if self._closed.is_set() or attempt == FETCH_ATTEMPTS:
                    raise
                body = {**body, "wait_ms": 0}
                await asyncio.sleep(pause)
                pause *= 2
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _done_through(self, goal: str, seq: int) -> None:
        """Records an acknowledgement (cumulative) of ``goal`` through ``seq``."""
        if seq > self._acked.get(goal, 0):
            self._acked[goal] = seq

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
                   kind: str | None = None,
                   attachments: Sequence[Mapping[str, Any] | str | os.PathLike[str]] = ()) -> wire.DeliveryReport | wire.NoteReport:
        """send_to_peer (§8): fire-and-forget into every live goal of ``to``. Returns the
        delivery report, a ``wire.DeliveryReport`` (attributes; a dict too): ``message_id``
        (the id given or chosen here; absent when nothing was attempted), ``delivered_to`` (the
        goal ids that stored it; empty when nobody got it), ``unreachable_reasons`` (why not,
        e.g. ``no live goals for `x```) and, for ``to="skill:<name>"``, ``routed_to``. An
        unreachable peer is a reason in the report, not an exception. Use it to tell, not to
        ask (``call`` waits for an answer). ``receipt`` asks for ``delivered`` or ``read``
        receipts, back in this goal's inbox; ``in_reply_to`` threads the message and passes on
        its hop budget. The id is chosen here, so a retry is stored once. ``attachments``
        carries files by reference (at most 16, each as :meth:`upload_file` returned it, a
        message delivered it, or a path on disk, uploaded first: §17); each receiver may then
        read them.

        A ``to`` of a person or a role (``"person:alice"``, ``"role:oncall"``) is not an agent:
        the text goes to them as a note instead (:meth:`note_person`, with ``metadata`` and
        ``message_id`` as its ``note_id``), and the result is its ``wire.NoteReport``
        (``item_id``, ``to``). A note carries no ``parts``, ``receipt`` or ``kind``
        (``ValueError``)."""
        if is_party(to):
            if parts or receipt or kind or attachments:
                raise ValueError(f"a note to {to} carries only text and metadata: no parts, "
                                 "receipt, kind or attachments")
            return await self.note_person(to, text, metadata=metadata, note_id=message_id)
        body = self._addressed(to, text, parts, metadata,
                               id=message_id or str(uuid.uuid4()))
        if receipt:
            body["receipt"] = receipt
        if kind:
            body["kind"] = kind
        await self._attach(body, attachments)
        trace = None
        if in_reply_to is not None:
            body["in_reply_to"] = in_reply_to.id
            if in_reply_to.ttl is not None:
                body["ttl"] = in_reply_to.ttl
            trace = in_reply_to.trace
        return wire.parse(wire.DeliveryReport,
                          await self.request(f"agent.send.{self.id}", body, trace=trace))

    # ----------------------------------------------------------------------- files (§17)
    async def upload_file(self, path: str | os.PathLike[str],
                          media_type: str = "application/octet-stream") -> wire.Attachment:
        """Uploads the file at ``path`` (its name is the path's last part) and returns its
        attachment, ``{name, media_type, size, sha256, ref}``, to put on a send or a call
        (``attachments=[...]``). Any size up to the service's limit (1 GiB by default); the
        service checks the digest. ``BadRequest`` (``file_too_large``, a bad name or media
        type), or ``quota_exceeded`` before any data moves."""
        with open(path, "rb") as source:
            return await files.upload(self, os.path.basename(os.fspath(path)), media_type,
                                      source)

    async def _attach(self, body: JSON, attachments: Iterable[Any]) -> None:
        """Puts ``attachments`` on a request body: each an attachment as given, or a path on
        disk uploaded first (its media type guessed from its name)."""
        carried = []
        for item in attachments:
            if isinstance(item, (str, os.PathLike)):
                guessed = mimetypes.guess_type(os.fspath(item))[0]
                item = await self.upload_file(item, guessed or "application/octet-stream")
            carried.append(dict(item))
        if carried:
            body["attachments"] = carried

    async def upload_bytes(self, name: str, media_type: str, data: bytes) -> wire.Attachment:
        """Uploads ``data`` as a file named ``name``; returns its attachment."""
        return await files.upload(self, name, media_type, data)

    async def read_attachment(self, attachment: Mapping[str, Any]) -> bytes:
        """The whole file of an attachment a message carried to you (or one you uploaded),
        its size and SHA-256 checked. ``NotFound`` when it is not yours to read."""
        out = io.BytesIO()
        await files.download(self, attachment, out)
        return out.getvalue()

    async def save_attachment(self, attachment: Mapping[str, Any],
                              path: str | os.PathLike[str]) -> int:
        """Saves an attachment's file at ``path`` (whole, or nothing), checked as
        :meth:`read_attachment`; returns its size. Never trust ``attachment.name`` as a path
        of its own: join it to a folder you chose (the service refuses names with ``/``)."""
        return await files.save(self, attachment, path)

    async def delete_file(self, file_id: str) -> bool:
        """Deletes a file you uploaded, now; its readers lose it too."""
        reply = await self.request(f"agent.files.delete.{self.id}", {"file_id": file_id})
        return bool(reply.get("deleted"))

    async def revoke_file(self, file_id: str, agent_id: str | None = None) -> int:
        """Takes back one reader of your file (``agent_id``), or every one; returns how many."""
        body: JSON = {"file_id": file_id}
        if agent_id:
            body["agent_id"] = agent_id
        reply = await self.request(f"agent.files.revoke.{self.id}", body)
        return int(reply.get("revoked", 0))

    async def broadcast(self, text: str, **options: Any) -> wire.DeliveryReport:
        """A message to every agent this one may reach (§8, ``to: "*"``)."""
        return await self.send("*", text, **options)

    async def send_status(self, message_id: str) -> wire.SendStatusReply:
        """Where a message sent with a ``receipt`` is, per goal: stored, delivered, read,
        expired_unread (§8, Receipts): ``status.goals``, each a ``wire.GoalReceipt``."""
        return wire.parse(wire.SendStatusReply, await self.request(
            f"agent.send.status.{self.id}", {"message_id": message_id}))

    # ----------------------------------------------------------------------- calls
    def _call_body(self, to: str, text: str, timeout_ms: int, parts: Sequence[Part],
                   metadata: Mapping[str, Any] | None, serving: Message | None,
                   correlation_id: str | None = None) -> JSON:
        body = self._addressed(to, text, parts, metadata, timeout_ms=timeout_ms,
                               correlation_id=correlation_id or call_id())
        if serving is not None:
            if serving.correlation_id:  # a call made while answering one (§9, the chain)
                body["parent_correlation_id"] = serving.correlation_id
            body["in_reply_to"] = serving.id
        return body

    async def call(self, to: str, text: str, *, timeout_ms: int = CALL_TIMEOUT_MS,
                   parts: Sequence[Part] = (), metadata: Mapping[str, Any] | None = None,
                   serving: Message | None = None,
                   correlation_id: str | None = None,
                   budget: Mapping[str, Any] | None = None,
                   attachments: Sequence[Mapping[str, Any] | str | os.PathLike[str]] = ()) -> wire.CallAnswer:
        """Asks ``to`` and waits for the answer (§9). Returns the ``wire.CallAnswer``
        (attributes; a dict too): ``body`` (the answer's text; a streamed answer's parts joined),
        ``parts``, ``from_agent_id``, ``correlation_id``, ``answered_at``, ``streamed`` (how
        many parts it was streamed in). Use it when the next step needs the answer.
        ``serving`` is the call this one is made while answering: its deadline bounds this one
        and cycles are refused. Raises :class:`~switchboard.errors.CallFailed` when the callee
        answered with an error (its handler raised: kind ``handler_error``),
        :class:`~switchboard.errors.CallTimeout` when nobody answers in time. After
        :class:`~switchboard.errors.Unavailable`, send it again with the same
        ``correlation_id``: the retry joins the first call instead of asking twice.
        ``budget`` (§16): ``{"cost": …, "tokens": …}`` for a new budget, or caps on what it
        draws from the call it serves; :class:`~switchboard.errors.BudgetExhausted` when
        nothing is left. ``attachments``: files by reference for the callee (§17), as on
        :meth:`send`; the answer's are ``answer.attachments``."""
        body = self._call_body(to, text, timeout_ms, parts, metadata, serving, correlation_id)
        _with_budget(body, budget, serving)
        await self._attach(body, attachments)
        answer = await self.request(f"agent.call.{self.id}", body,
                                    trace=serving.trace if serving else None,
                                    timeout=timeout_ms / 1000 + self.request_timeout)
        return _answered(answer)

    async def call_parked(self, to: str, text: str, *, timeout_ms: int = CALL_TIMEOUT_MS,
                          parts: Sequence[Part] = (),
                          metadata: Mapping[str, Any] | None = None,
                          serving: Message | None = None,
                          correlation_id: str | None = None,
                          budget: Mapping[str, Any] | None = None,
                          attachments: Sequence[Mapping[str, Any] | str | os.PathLike[str]] = ()) -> wire.CallParked:
        """Asks ``to`` without waiting (§9, ``wait: false``): a ``wire.CallParked`` at once
        (``correlation_id``, ``delivered_to``, ``deadline``); the answer (a ``kind: response``
        message with this ``correlation_id``) or a timeout notice (``kind: notify``) lands in
        this goal's inbox later. A streamed answer comes as ``response`` messages with
        ``message.part`` 1, 2, … then the final one (``part`` ``None``). An answer that is an
        error has ``message.error``; ``message.raise_for_error()`` raises it as
        :class:`~switchboard.errors.CallFailed`. Use it to ask several agents at once, or
        when the agent has other work."""
        body = self._call_body(to, text, timeout_ms, parts, metadata, serving, correlation_id)
        _with_budget(body, budget, serving)
        body["wait"] = False
        await self._attach(body, attachments)
        return wire.parse(wire.CallParked, await self.request(
            f"agent.call.{self.id}", body, trace=serving.trace if serving else None))

    async def call_stream(self, to: str, text: str, *, timeout_ms: int = CALL_TIMEOUT_MS,
                          parts: Sequence[Part] = (),
                          metadata: Mapping[str, Any] | None = None,
                          serving: Message | None = None,
                          correlation_id: str | None = None,
                          attachments: Sequence[Mapping[str, Any] | str | os.PathLike[str]] = (),
                          ) -> AsyncIterator[wire.CallPart | wire.CallAnswer]:
        """Asks ``to`` and yields its answer as it comes (§9, "Streamed answers"): each part
        first, a ``wire.CallPart`` (``partial`` true, ``part`` numbered from 1, ``body``
        that part's text, ``parts``), in order and without gaps; then, last, the final
        ``CallAnswer`` (no ``partial``), whose ``body`` is every part's text joined plus the
        final reply's (which may add nothing) and ``streamed`` the number of parts. A callee
        that does not stream yields just the ``CallAnswer``. Parts lost in a reconnect are
        read back. Raises :class:`~switchboard.errors.CallFailed` in place of the final
        answer when the callee ended with an error (the parts before it were yielded), and
        :class:`~switchboard.errors.CallTimeout` as ``call`` does. Use it to show a long
        answer while it is written:

            async for event in agent.call_stream("writer", "draft"):
                if isinstance(event, CallPart):
                    print(event.body, end="")          # part 1, 2, …
                else:
                    answer = event                     # the whole answer (a CallAnswer)"""
        body = self._call_body(to, text, timeout_ms, parts, metadata, serving, correlation_id)
        body["stream"] = True
        await self._attach(body, attachments)
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
                    for part in back.parts:
                        if part.part == next_part:
                            next_part += 1
                            yield part
                    if back.answer:
                        yield _answered(back.answer)
                        return
                    raise error_for("timeout", 504,
                                    f"no answer from `{to}` within {timeout_ms} ms") from None
                reply = _decode(f"agent.call.{self.id}", msg)
                if reply.get("partial"):
                    streamed = wire.parse(wire.CallPart, reply)
                    if streamed.part > next_part:  # a gap: read back what is missing
                        back = await self._parts_after(correlation_id, next_part - 1)
                        for part in back.parts:
                            if part.part == next_part:
                                next_part += 1
                                yield part
                    if streamed.part == next_part:
                        next_part += 1
                        yield streamed
                    continue
                if reply.get("streamed", 0) >= next_part:  # parts that never arrived
                    back = await self._parts_after(correlation_id, next_part - 1)
                    for part in back.parts:
                        if part.part == next_part:
                            next_part += 1
                            yield part
                yield _answered(reply)
                return
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _parts_after(self, correlation_id: str, after: int) -> wire.CallParts:
        return wire.parse(wire.CallParts, await self.request(
            f"agent.calls.parts.{self.id}", {"correlation_id": correlation_id, "after": after}))

    async def reply(self, correlation_id: str, text: str, *, parts: Sequence[Part] = (),
                    error: Mapping[str, str] | None = None,
                    trace: Mapping[str, str] | None = None,
                    attachments: Sequence[Mapping[str, Any] | str | os.PathLike[str]] = ()) -> wire.ReplyAck:
        """reply_to_peer (§9): the final answer to the call ``correlation_id``; the
        ``ReplyAck`` says where the answer went. A repeat is ``duplicate: true`` and sends
        nothing. After streamed parts, ``text`` is appended to theirs and may be empty (it
        just ends the stream). ``error={"kind", "message"}`` answers with an error instead
        (kind 1–64 characters of ``[a-z0-9_]``, message cut to 1024 characters; ``text`` then
        empty): the caller gets :class:`~switchboard.errors.CallFailed`. ``attachments``
        carries files by reference (§17) the caller may then read."""
        body: JSON = {"correlation_id": correlation_id}
        if error is not None:  # a failure is a final reply with nothing else (§9)
            if text or parts:
                raise ValueError("a reply with `error` carries no text or parts")
            body["error"] = {"kind": error["kind"],
                             "message": str(error.get("message", ""))[:ERROR_MESSAGE_MAX]}
        else:
            body["message"] = text
        if parts:
            body["parts"] = list(parts)
        await self._attach(body, attachments)
        return wire.parse(wire.ReplyAck,
                          await self.request(f"agent.reply.{self.id}", body, trace=trace))

    async def reply_part(self, correlation_id: str, part: int, text: str, *,
                         parts: Sequence[Part] = (),
                         trace: Mapping[str, str] | None = None,
                         attachments: Sequence[Mapping[str, Any] | str | os.PathLike[str]] = ()) -> wire.ReplyAck:
        """Part ``part`` of a streamed answer (§9), numbered from 1 (1, 2, …): the call stays
        open until :meth:`reply` sends the final answer (``reply(id, "")`` adds no text).
        Numbered, so a retry is taken once. ``attachments`` stay with this part (§17)."""
        body: JSON = {"correlation_id": correlation_id, "message": text, "partial": True,
                      "part": part}
        if parts:
            body["parts"] = list(parts)
        await self._attach(body, attachments)
        return wire.parse(wire.ReplyAck,
                          await self.request(f"agent.reply.{self.id}", body, trace=trace))

    async def pending_calls(self) -> wire.PendingCalls:
        """This agent's open calls, ``outgoing`` and ``incoming`` (§9), each a list of
        ``wire.PendingCall``."""
        return wire.parse(wire.PendingCalls,
                          await self.request(f"agent.calls.pending.{self.id}", {}))

    # ----------------------------------------------------------------------- tasks
    async def create_task(self, to: str, text: str, *, parts: Sequence[Part] = (),
                          deadline_in_ms: int | None = None, task_id: str | None = None,
                          metadata: Mapping[str, Any] | None = None,
                          callback: Mapping[str, Any] | None = None,
                          in_reply_to: Message | None = None,
                          budget: Mapping[str, Any] | None = None,
                          attachments: Sequence[Mapping[str, Any] | str | os.PathLike[str]] = ()) -> TaskHandle:
        """Hands ``to`` a piece of work with a state, followed to its end (§10): use a task,
        not a call, for work that takes long, may ask questions, or splits into subtasks.
        Updates (``kind: task_update``) come to this goal. The id is chosen here, so a retry
        is recognised. ``attachments``: files for the assignee (§17), as on :meth:`send`."""
        body = self._task_body(to, text, parts, deadline_in_ms, task_id, metadata, callback,
                               in_reply_to)
        _with_budget(body, budget, in_reply_to)
        await self._attach(body, attachments)
        reply = wire.parse(wire.TaskReply, await self.request(
            f"agent.task.create.{self.id}", body,
            trace=in_reply_to.trace if in_reply_to else None))
        return TaskHandle(self, reply.task)

    async def spawn(self, parent_task_id: str, to: str, text: str, **options: Any) -> TaskHandle:
        """A subtask of the task this agent is working on (§10, Subtasks); ``to="self"`` keeps
        it. Canceling or ending the parent cancels it."""
        body = self._task_body(to, text, options.get("parts", ()),
                               options.get("deadline_in_ms"), options.get("task_id"),
                               options.get("metadata"), options.get("callback"), None)
        body["parent_task_id"] = parent_task_id
        _with_budget(body, options.get("budget"), None)
        await self._attach(body, options.get("attachments", ()))
        reply = wire.parse(wire.TaskReply, await self.request(f"agent.task.spawn.{self.id}", body))
        return TaskHandle(self, reply.task)

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
                      trace: Mapping[str, str] | None = None,
                      attachments: Sequence[Mapping[str, Any] | str | os.PathLike[str]] = ()) -> wire.TaskRecord:
        """One transition (§10): ``accept``, ``reject``, ``start``, ``progress``,
        ``input_required``, ``complete``, ``fail`` or ``cancel``; the task after it, a
        ``wire.TaskRecord`` (``record.state``, ``record.result``). ``attachments``: files for
        the other party (§17); a completion's are the task's ``result_attachments``."""
        body: JSON = {"task_id": task_id}
        if text is not None:
            body["message"] = text
        if parts:
            body["parts"] = list(parts)
        await self._attach(body, attachments)
        if op == "accept" and self.goal_id:
            body["from_goal_id"] = self.goal_id
        reply = await self.request(f"agent.task.{op}.{self.id}", body, trace=trace)
        return wire.parse(wire.TaskReply, reply).task

    async def get_task(self, task_id: str) -> wire.TaskRecord:
        """A task this agent is a party of, as stored (§10)."""
        reply = await self.request(f"agent.task.get.{self.id}", {"task_id": task_id})
        return wire.parse(wire.TaskReply, reply).task

    async def list_tasks(self, **filters: Any) -> wire.TaskList:
        """This agent's tasks (§10): ``role``, ``state``, ``parent``, ``peer``, ``limit``,
        ``cursor``, ``newest_first``; a ``wire.TaskList``: ``tasks`` (each a
        ``wire.TaskRecord``), ``next_cursor``, ``total``."""
        return wire.parse(wire.TaskList, await self.request(f"agent.task.list.{self.id}", filters))

    async def cancel_task(self, task_id: str, reason: str | None = None) -> wire.TaskRecord:
        """Cancels a task this agent gave, and its open subtasks (§10)."""
        return await self.task_op("cancel", task_id, reason)

    # ----------------------------------------------------------------------- people
    async def _people(self, op: str, body: Mapping[str, Any]) -> JSON:
        return await self.request(f"agent.people.{op}.{self.id}", body)

    def _answer_goal(self, goal_id: str | None) -> str:
        goal = goal_id or self.goal_id
        if goal is None:
            raise ValueError("no goal: open one first (the answer comes to a goal's inbox)")
        return goal

    async def people(self) -> wire.PeopleList:
        """The persons and roles of the people file (§14, ``list``): a ``wire.PeopleList``,
        ``people`` (each a ``wire.PersonEntry``: ``id`` such as ``"person:alice"``, ``name``,
        ``roles``, ``approver`` — whether they may decide approvals — and ``reachable`` —
        whether this agent may address them) and ``roles`` (each a ``wire.RoleEntry``: ``id``
        such as ``"role:oncall"``, ``members``, ``reachable``). Look here before asking."""
        return wire.parse(wire.PeopleList, await self._people("list", {}))

    async def note_person(self, to: str, text: str, *,
                          metadata: Mapping[str, Any] | None = None,
                          note_id: str | None = None) -> wire.NoteReport:
        """Tells a person or a role something (``"person:alice"``, ``"role:oncall"``; §14,
        ``note``): it waits, unread, in their inbox; nothing comes back when they read it. A
        ``wire.NoteReport`` (``item_id``, ``to``). The id (``note_id``) is chosen here, so a
        retry with the same one is noted once. To get an answer, :meth:`ask_person`.
        ``send(to, text)`` with such a ``to`` does the same."""
        body: JSON = {"to": to, "message": text, "note_id": note_id or str(uuid.uuid4())}
        if metadata:
            body["metadata"] = dict(metadata)
        return wire.parse(wire.NoteReport, await self._people("note", body))

    async def ask_person(self, to: str, question: str, *, timeout_ms: int | None = None,
                         escalate_after_ms: int | None = None, escalate_to: str | None = None,
                         goal_id: str | None = None, ask_id: str | None = None,
                         metadata: Mapping[str, Any] | None = None) -> wire.Parked:
        """Asks a person, or a role (its first member to answer answers; §14, ``ask``), and
        returns at once: a ``wire.Parked`` (``item_id``, ``to``, ``deadline``,
        ``escalate_at``). The answer comes later to the goal (``goal_id``, by default the
        current one) as one message, ``kind: response`` from ``people`` with
        ``correlation_id`` = ``item_id`` and :attr:`Message.from_person` the person; or, when
        nobody answered within ``timeout_ms`` (default one hour, at most seven days), a
        ``kind: notify`` timeout notice. ``message.person_answer(parked.item_id)`` tells them
        from the rest of the goal's mail. ``escalate_after_ms`` with ``escalate_to``: unanswered
        that long, the question goes to ``escalate_to`` too, once (a notice says so; it is not
        the ending). The ask's id (``ask_id``) is chosen here: after
        :class:`~switchboard.errors.Unavailable`, ask again with the same one and the retry
        joins the first ask (``joined``) instead of asking twice."""
        body: JSON = {"to": to, "message": question, "from_goal_id": self._answer_goal(goal_id),
                      "ask_id": ask_id or str(uuid.uuid4())}
        if timeout_ms is not None:
            body["timeout_ms"] = timeout_ms
        if escalate_after_ms is not None:
            body["escalate_after_ms"] = escalate_after_ms
        if escalate_to is not None:
            body["escalate_to"] = escalate_to
        if metadata:
            body["metadata"] = dict(metadata)
        return wire.parse(wire.Parked, await self._people("ask", body))

    async def request_approval(self, tool: str, arguments: Any, reason: str, to: str,
                               expires_in_ms: int, *, escalate_after_ms: int | None = None,
                               escalate_to: str | None = None, goal_id: str | None = None,
                               approval_id: str | None = None) -> wire.Parked:
        """Asks a person with approver access (or a role with one among its members) to
        approve one exact action before the agent does it (§14, "Approvals"): ``tool`` and
        its ``arguments`` (any JSON; an integer beyond ±(2^53 − 1) is refused, send it as a
        string), with ``reason`` shown to the person. Returns at once a ``wire.Parked`` whose
        ``action_hash`` binds the approval to that action (SHA-256 of its RFC 8785 JSON: key
        order does not matter, any other change does). The decision comes to the goal as the
        answer of :meth:`ask_person` does (:attr:`Message.approved` says which), or a
        timeout notice when nobody decided within ``expires_in_ms``, which is also how long the
        approval may be used. When approved, :meth:`use_approval` right before acting. The
        id (``approval_id``) is chosen here, so a retry with it joins the first request."""
        body: JSON = {"action": {"tool": tool, "arguments": arguments}, "reason": reason,
                      "to": to, "from_goal_id": self._answer_goal(goal_id),
                      "expires_in_ms": expires_in_ms,
                      "approval_id": approval_id or str(uuid.uuid4())}
        if escalate_after_ms is not None:
            body["escalate_after_ms"] = escalate_after_ms
        if escalate_to is not None:
            body["escalate_to"] = escalate_to
        return wire.parse(wire.Parked, await self._people("approval.request", body))

    async def use_approval(self, approval_id: str, tool: str, arguments: Any, *,
                           use_id: str | None = None) -> wire.ApprovalUsed:
        """Spends approval ``approval_id`` on the action about to be done (§14, "Use"): act
        only when this returns. A ``wire.ApprovalUsed`` (``decided_by``, ``decided_at``,
        ``note``, ``used_at``). Refused — do not act — with
        :class:`~switchboard.errors.Conflict` ``action_mismatch`` when ``tool`` or
        ``arguments`` differ from what was approved, ``approval_pending`` before the decision,
        ``approval_used`` when it was used already (each approval is good for one use);
        :class:`~switchboard.errors.AccessDenied` ``approval_denied``;
        :class:`~switchboard.errors.Expired` past its deadline. The ``use_id`` is chosen here:
        a retry with the same one gets the first use's reply again (``duplicate``)."""
        body: JSON = {"approval_id": approval_id,
                      "action": {"tool": tool, "arguments": arguments},
                      "use_id": use_id or str(uuid.uuid4())}
        return wire.parse(wire.ApprovalUsed, await self._people("approval.use", body))

    async def person_item(self, item_id: str) -> wire.PersonItem:
        """One of this agent's notes, asks or approvals as the people service holds it (§14,
        ``get``): a ``wire.PersonItem``, ``state`` (``unread``, ``read``, ``open``,
        ``escalated``, ``answered``, ``approved``, ``denied``, ``expired``, ``used``),
        ``answer`` (``by``, ``message``, ``decision``) once a person answered, ``deadline``…"""
        return wire.parse(wire.PersonItem, await self._people("get", {"item_id": item_id}))

    async def people_pending(self) -> wire.PendingItems:
        """This agent's asks and approvals still waiting for a person, and its approvals
        approved and not used yet, oldest first (§14, ``pending``): a ``wire.PendingItems``
        whose ``items_`` are ``wire.PersonItem`` (``pending["items"]`` too)."""
        return wire.parse(wire.PendingItems, await self._people("pending", {}))

    # ----------------------------------------------------------------------- provider limits
    async def acquire_limit(self, key: str, *, tokens: int = 0, wait_ms: int = 30_000,
                            hold_ms: int | None = None) -> "Lease":
        """Takes a lease on provider limit ``key`` (``"openai:gpt-4.1"``; §15, ``acquire``)
        drawing ``tokens`` (an estimate), waiting up to ``wait_ms`` (at most 60000) in a queue
        fair across agents. A :class:`Lease`; :class:`~switchboard.Busy` (kind ``limited``)
        when none came in time. Prefer ``async with agent.limit(key, tokens=…)``, which gives
        the lease back for you."""
        body: JSON = {"key": key, "tokens": tokens, "wait_ms": wait_ms,
                      "lease_id": str(uuid.uuid4())}
        if hold_ms is not None:
            body["hold_ms"] = hold_ms
        reply = await self.request(f"agent.limits.acquire.{self.id}", body,
                                   timeout=wait_ms / 1000 + self.request_timeout)
        return Lease(self, wire.parse(wire.Lease, reply))

    @contextlib.asynccontextmanager
    async def limit(self, key: str, *, tokens: int = 0, wait_ms: int = 30_000,
                    hold_ms: int | None = None) -> AsyncIterator["Lease"]:
        """A lease on provider limit ``key`` for the block, given back when it ends with the
        tokens reported by ``lease.used(n)`` (else the estimate)::

            async with agent.limit("openai:gpt-4.1", tokens=1200) as lease:
                reply = await llm.chat(...)
                lease.used(reply.usage.total_tokens)

        The fleet never holds more leases than the operator declared for the key, so the
        provider never answers 429 for the fleet as a whole."""
        lease = await self.acquire_limit(key, tokens=tokens, wait_ms=wait_ms, hold_ms=hold_ms)
        try:
            yield lease
        finally:
            with contextlib.suppress(SwitchboardError):
                await lease.release()

    # ----------------------------------------------------------------------- budgets (§16)
    async def spend(self, budget: Mapping[str, Any], *, tokens: int = 0,
                    cost: int = 0) -> wire.BudgetView:
        """Reports what this agent spent on the work whose budget is ``budget``
        (``msg.budget``): ``tokens`` and ``cost`` (micro-units: 1_000_000 is $1.00 in USD).
        Charged up to what the work has left (the rest is ``over``); the reply says what is
        ``left``. Not retried: a lost reply may have been charged."""
        body = {"root": budget["root"], "work": budget["work"], "tokens": tokens, "cost": cost}
        return wire.parse(wire.BudgetView,
                          await self.request(f"agent.budget.spend.{self.id}", body))

    async def budget(self, budget: Mapping[str, Any]) -> wire.BudgetView:
        """A budget this agent works under or gave (§16): granted, ``spent``, held by
        ``children``, ``left``, and the tree's totals."""
        body = {"root": budget["root"], "work": budget["work"]}
        return wire.parse(wire.BudgetView,
                          await self.request(f"agent.budget.get.{self.id}", body))

    async def audit_cost(self, *, root: str | None = None,
                         agent_id: str | None = None) -> wire.CostReport:
        """What each agent spent in budget tree ``root`` (the root call's or task's id), or
        ``agent_id``'s spend per tree, as the audit recorded it (§16, ``agent.audit.cost``)."""
        body = {k: v for k, v in (("root", root), ("agent_id", agent_id)) if v is not None}
        return wire.parse(wire.CostReport, await self.request("agent.audit.cost", body))

    async def limit_view(self, key: str) -> wire.LimitView:
        """Provider limit ``key`` as declared, what is in use and waiting, and this agent's own
        leases (§15, ``get``): a ``wire.LimitView``."""
        return wire.parse(wire.LimitView,
                          await self.request(f"agent.limits.get.{self.id}", {"key": key}))


def _with_budget(body: JSON, budget: Mapping[str, Any] | None,
                 serving: Message | None) -> None:
    """``budget`` into a call or task body: a grant (``msg.budget``, with ``root`` and
    ``work``) draws on that work; amounts (``cost``, ``tokens``) ask for a new budget or cap
    what is drawn from the work being served."""
    if budget is None:
        return
    ask = {k: budget[k] for k in ("tokens", "cost") if budget.get(k) is not None}
    if "root" in budget and "work" in budget:
        ask = {"root": budget["root"], "parent": budget["work"]}
    elif "root" in budget and "parent" in budget:
        ask.update(root=budget["root"], parent=budget["parent"])
    body["budget"] = ask


class Lease:
    """A lease on a provider limit (§15): ``lease_id``, ``key``, ``tokens`` drawn,
    ``expires_at`` (it returns by itself then, unless renewed) and ``waited_ms``."""

    def __init__(self, agent: Agent, lease: wire.Lease):
        self.agent, self.lease = agent, lease
        self.lease_id, self.key = lease.lease_id, lease.key
        self.tokens, self.expires_at, self.waited_ms = lease.tokens, lease.expires_at, lease.waited_ms
        self.tokens_used: int | None = None
        self.released = False

    def used(self, tokens: int) -> None:
        """Reports the tokens the provider call used; the release corrects the limit's token
        bucket by the difference from the estimate."""
        self.tokens_used = tokens

    async def release(self, tokens_used: int | None = None) -> wire.Released:
        """Gives the lease back (safe to repeat): a ``wire.Released``, ``released`` false when
        it had expired already."""
        used = tokens_used if tokens_used is not None else self.tokens_used
        body: JSON = {"key": self.key, "lease_id": self.lease_id}
        if used is not None:
            body["tokens_used"] = used
        self.released = True
        return wire.parse(wire.Released, await self.agent.request(
            f"agent.limits.release.{self.agent.id}", body))

    async def renew(self, hold_ms: int | None = None) -> None:
        """Holds the lease ``hold_ms`` more from now (default and most: the limit's
        ``max_hold_ms``); :class:`~switchboard.NotFound` when it is gone."""
        body: JSON = {"key": self.key, "lease_id": self.lease_id}
        if hold_ms is not None:
            body["hold_ms"] = hold_ms
        renewed = wire.parse(wire.Lease, await self.agent.request(
            f"agent.limits.renew.{self.agent.id}", body))
        self.expires_at = renewed.expires_at


def _answered(answer: Mapping[str, Any]) -> wire.CallAnswer:
    """``answer`` as a ``wire.CallAnswer`` when it is an answer; :class:`CallFailed` when the
    callee answered with an error (§9, ``error``)."""
    failed = CallFailed.from_answer(answer)
    if failed is not None:
        raise failed
    return wire.parse(wire.CallAnswer, answer)


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
    # A refusal has the micro error header (and a top-level `error`). A call's answer may carry
    # an `error` too, the callee's (§9: `{kind, message}` beside `correlation_id`): that one
    # is an answer, which `call` raises as CallFailed.
    refused = "Nats-Service-Error-Code" in headers or (
        isinstance(data, dict) and "error" in data and "correlation_id" not in data)
    if isinstance(data, dict) and refused:
        err = data.get("error") or {}
        code = err.get("code") or headers.get("Nats-Service-Error-Code") or 500
        raise error_for(err.get("kind", "unknown"), int(code),
                        err.get("message", headers.get("Nats-Service-Error", "")))
    return data
