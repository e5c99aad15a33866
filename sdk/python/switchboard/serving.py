"""``Agent.serve``: a handler run on every inbox message, up to N at once, that survives its
handler raising and stops gracefully (docs/protocol.md §7 for the reading rules it keeps).

What it guarantees:

- **A handler that raises never loses its message.** A call (§9) is answered at once with
  ``error = {"kind": "handler_error", "message": <the exception's text>}``, so its caller gets
  :class:`~switchboard.errors.CallFailed` instead of waiting for the deadline. A task (§10,
  ``kind: task``) is ended for its requester with the exception's text as the reason:
  ``rejected`` while it is still ``submitted``, ``failed`` once this goal accepted it (from
  ``accepted`` or ``input_required`` it is started first, since only a ``working`` task can
  fail); a task that has ended already is left as it is. Either way the message is then
  acknowledged. Any other message (and a task that cannot be ended: it is gone, another goal
  holds it, the fabric refused) is rejected into the dead letters (§7, ``ack`` with ``seq``
  and ``reject``) with the exception's text as the reason, where an operator sees it
  (``switchboard dlq list``) and can put it back (``switchboard dlq replay``). Then the next
  message is served.
- **Acknowledgements stay cumulative and correct** however many handlers run at once: the
  goal's cursor moves through a sequence only when every message at or below it is done, so a
  crash hands out again exactly the messages not finished (and, being at least once, perhaps a
  few that were). They cost no request of their own while messages keep coming: every fetch
  of the loop carries them (``ack_through``, written by the service with the next hand-out),
  and one that no fetch's reply has confirmed within :data:`ACK_LINGER` (25 ms) is sent on
  its own.
- **A graceful stop** (``agent.stop()``, SIGTERM or SIGINT): no new message is started, the
  handlers in progress finish and are acknowledged, then the goal is closed and the agent
  deregistered. A second signal stops at once: the handlers still running are cancelled, their
  messages are not acknowledged and the goal is kept, as after a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import signal
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .errors import Expired, SwitchboardError, Unavailable, error_for
from .message import Message

if TYPE_CHECKING:
    from .agent import Agent

log = logging.getLogger("switchboard")

#: What a raising handler's call is answered with (``error.kind``), in every SDK.
HANDLER_ERROR = "handler_error"
#: The most of an exception's text an error answer carries (the wire's limit).
ERROR_MESSAGE_MAX = 1024
#: How long a handled message's ack waits to ride on the loop's next fetch before it is sent
#: on its own (the Rust client's ``ACK_LINGER``).
ACK_LINGER = 0.025
#: The task states nothing changes again (docs/protocol.md §10).
TERMINAL_TASK_STATES = ("completed", "failed", "rejected", "canceled")

Handler = Callable[[Message], Awaitable[Any] | Any]


def exception_text(exc: BaseException) -> str:
    """What a caller or a dead letter is told of an exception: its text (its type's name when
    it has none), at most 1024 characters."""
    return (str(exc) or type(exc).__name__)[:ERROR_MESSAGE_MAX]


class _Entry:
    """A message being handled: its sequence, whether its handler is done, and whether it is
    to be rejected (the reason) rather than acknowledged."""

    __slots__ = ("seq", "done", "reject")

    def __init__(self, seq: int):
        self.seq, self.done, self.reject = seq, False, None


class Serving:
    """One ``serve`` loop of one agent on one goal. Made by :meth:`Agent.serve`."""

    def __init__(self, agent: "Agent", goal_id: str, handler: Handler, *, max_concurrent: int,
                 batch: int, wait_ms: int):
        if max_concurrent < 1:
            raise ValueError("max_concurrent must be at least 1")
        self.agent, self.goal_id, self.handler = agent, goal_id, handler
        self.max_concurrent, self.batch, self.wait_ms = max_concurrent, batch, wait_ms
        self.stopping = asyncio.Event()
        self.finished = asyncio.Event()
        self.forced = False
        self.tasks: set[asyncio.Task] = set()
        self._slots = asyncio.Semaphore(max_concurrent)
        self._order: deque[_Entry] = deque()  # started, in sequence order, not yet acked
        self._ack_lock = asyncio.Lock()
        self._owed = 0  # the cumulative ack settled so far, sent or not
        self._confirmed = 0  # where the service last said the cursor is
        self._lingering: asyncio.Task | None = None

    # ------------------------------------------------------------------------- stopping
    def request_stop(self) -> None:
        """Stop taking messages; let the handlers in progress finish (graceful)."""
        self.stopping.set()

    def _on_signal(self, signum: int) -> None:
        if not self.stopping.is_set():
            log.info("switchboard: %s: stopping after the %d handler(s) in progress",
                     signal.Signals(signum).name, len(self.tasks))
            self.request_stop()
            return
        # A second signal: stop now, as a crash would (nothing unfinished is acknowledged).
        log.warning("switchboard: %s again: cancelling %d handler(s); the goal is kept",
                    signal.Signals(signum).name, len(self.tasks))
        self.forced = True
        for task in list(self.tasks):
            task.cancel()

    @contextlib.contextmanager
    def _signals(self, signals: Iterable[int]):
        loop = asyncio.get_running_loop()
        installed = []
        for sig in signals:
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                # Not the main thread, or a platform without loop signal handlers: the caller
                # stops the loop with agent.stop() instead.
                log.debug("switchboard: cannot handle signal %s here", sig)
        try:
            yield
        finally:
            for sig in installed:
                with contextlib.suppress(Exception):
                    loop.remove_signal_handler(sig)

    async def _until_stop(self, awaitable: Awaitable[Any]) -> tuple[bool, Any]:
        """Awaits ``awaitable`` unless a stop comes first: ``(True, result)``, or ``(False,
        None)`` once it was cancelled for the stop."""
        task = asyncio.ensure_future(awaitable)
        stop = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # the loop itself was cancelled: take the work with it
            task.cancel()
            raise
        finally:
            stop.cancel()
        if task.done() and not self.stopping.is_set():
            return True, task.result()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        return False, None

    # ------------------------------------------------------------------------- the loop
    async def run(self, stop_signals: Iterable[int]) -> None:
        agent = self.agent
        queue: deque[dict] = deque()  # fetched, not started yet
        after: int | None = None
        drained = False
        try:
            with self._signals(stop_signals):
                while not agent.is_closed and not self.stopping.is_set():
                    if not queue:
                        fetched, page = await self._until_stop(self._fetch(after))
                        if not fetched:
                            continue  # stopping
                        if page is None:
                            break  # the agent closed under the loop
                        for entry in page["messages"]:
                            # Hand-out is at least once (§7): a message at or below the
                            # last one fetched is a repeat, dropped.
                            if after is not None and entry["seq"] <= after:
                                continue
                            queue.append(entry)
                            after = entry["seq"]
                        continue
                    acquired, _ = await self._until_stop(self._slots.acquire())
                    if acquired:
                        self._start(queue.popleft())
                if self.stopping.is_set() and not agent.is_closed:
                    await self._drain()  # a second signal may cut it short (forced)
                    drained = True
            if drained:
                # The graceful stop's end: close the goal and deregister; a forced stop only
                # disconnects (its cancelled handlers' messages wait in the goal).
                await agent.close(keep_goal=self.forced)
        finally:
            if self._lingering is not None:
                self._lingering.cancel()
            if not drained:
                # Cancelled, failed, or the agent closed under it: whatever is unfinished is
                # not acknowledged, so it is handed out again.
                for task in list(self.tasks):
                    task.cancel()
                with contextlib.suppress(BaseException):
                    await asyncio.gather(*self.tasks, return_exceptions=True)
            self.finished.set()

    async def _drain(self) -> None:
        """Waits for the handlers in progress (a second signal cancels them), then for their
        acknowledgements."""
        while self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        async with self._ack_lock:
            if self._owed > self._confirmed:
                await self._write({"goal_id": self.goal_id, "through": self._owed})

    async def _fetch(self, after: int | None) -> dict | None:
        """The next page of the goal: after the last message fetched (§7 ``after``: a reader
        handling several at once reads past what it has not acked yet, and such a read does
        not count as a hand-out of the oldest). Retries while the fabric is unavailable;
        ``None`` once the agent is closed."""
        body: dict[str, Any] = {"goal_id": self.goal_id, "max": self.batch,
                                "wait_ms": self.wait_ms}
        if after is not None:
            body["after"] = after
        pause = 0.2
        while True:
            if self._owed:
                # Every settled ack rides along (idempotent): no request of its own.
                body["ack_through"] = self._owed
            try:
                page = await self.agent._fetch(body)
                self._confirmed = max(self._confirmed, page.get("cursor", 0))
                return page
            except Unavailable as exc:
                if self.agent.is_closed:
                    return None
                log.warning("switchboard: fetching goal %s: %s; retrying", self.goal_id, exc)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 5.0)
            except Exception:
                if self.agent.is_closed:
                    return None
                raise

    def _start(self, entry: dict) -> None:
        slot = _Entry(entry["seq"])
        self._order.append(slot)
        message = Message(self.agent, self.goal_id, entry)
        message._serving = self
        task = asyncio.create_task(self._handle(message, slot))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _handle(self, message: Message, slot: _Entry) -> None:
        try:
            try:
                result = self.handler(message)
                if inspect.isawaitable(result):
                    await result
                slot.reject = message._reject_reason
            except Exception as exc:  # the handler raised: answer or reject, then go on
                log.exception("switchboard: the handler raised on %r (seq %d)", message,
                              message.seq)
                slot.reject = await self._after_failure(message, exc)
        finally:
            self._slots.release()
        # Cancelled (a forced stop): not done, so never acknowledged. Otherwise acknowledge.
        slot.done = True
        await self._advance()

    async def _after_failure(self, message: Message, exc: Exception) -> str | None:
        """A raising handler's message: a call is answered with the error at once, a task is
        ended for its requester (``None``: then acknowledged); anything else is to be
        rejected with the reason returned."""
        text = exception_text(exc)
        task = message.raw.get("task")  # only the task service writes it (§8: not a send)
        if message.kind == "task" and isinstance(task, Mapping) and task.get("id"):
            return await self._end_task(message, str(task["id"]), text)
        if not message.is_call:
            return text
        try:
            await message.reply_error(HANDLER_ERROR, text)
            return None
        except Expired:
            return None  # the call is over: nobody waits for an answer any more
        except SwitchboardError as failed:
            log.warning("switchboard: could not answer call %s with its error (%s); "
                        "rejecting it", message.correlation_id, failed)
            return f"{text} (the error answer failed: {failed})"

    async def _end_task(self, message: Message, task_id: str, text: str) -> str | None:
        """Ends the task of a ``kind: task`` message whose handler raised, so that its
        requester hears why (§10): ``reject`` while it is ``submitted``; ``fail`` once this
        goal accepted it (``start`` first from ``accepted`` or ``input_required``: only a
        ``working`` task fails); nothing once it ended. ``None`` when it is done (the message
        is then acknowledged), else the reason to reject the message with (the task is gone,
        another goal took it, or the fabric refused)."""
        agent = self.agent
        reason = text if text.strip() else "the handler failed"

        async def op(name: str, body: str | None = None) -> None:
            await agent.task_op(name, task_id, body, trace=message.trace)

        try:
            record = await agent.get_task(task_id)
            state = record.get("state")
            if record.get("assignee") != agent.id:
                raise error_for("not_allowed", 403, f"task {task_id} is not given to {agent.id}")
            if state == "submitted":
                await op("reject", reason)
            elif state in ("accepted", "working", "input_required"):
                holder = record.get("assignee_goal")
                if holder not in (None, self.goal_id, agent.goal_id):
                    raise error_for("conflict", 409,
                                    f"task {task_id} is held by another goal ({holder})")
                if state != "working":
                    await op("start")
                await op("fail", reason)
            elif state not in TERMINAL_TASK_STATES:
                raise error_for("illegal_transition", 409,
                                f"task {task_id} is {state}: it cannot be ended")
            return None  # ended now, or already: the requester has its answer
        except Exception as failed:  # gone, held elsewhere, refused: keep the message
            if isinstance(failed, SwitchboardError) and failed.kind in ("expired",
                                                                        "task_terminal"):
                return None  # it ended meanwhile (its deadline, a cancel): nothing to do
            log.warning("switchboard: could not end task %s after its handler raised (%s); "
                        "rejecting its message", task_id, failed)
            return f"{text} (the task could not be ended: {failed})"

    async def _advance(self) -> None:
        """Moves the cursor through every message done at the front of the order: one ack
        through the last of them, or a reject of each rejected one (a reject moves the cursor
        through its message, so it acknowledges the done ones before it too)."""
        async with self._ack_lock:
            through = None
            while self._order and self._order[0].done:
                slot = self._order.popleft()
                if slot.reject is not None:
                    await self._write({"goal_id": self.goal_id, "seq": slot.seq,
                                       "reject": slot.reject})
                    through = None
                else:
                    through = slot.seq
            if through is not None:
                # Owed: the next fetch carries it, or the linger sends it.
                self._owed = max(self._owed, through)
                if self._lingering is None and self._owed > self._confirmed:
                    self._lingering = asyncio.create_task(self._linger(self._owed))

    async def _linger(self, waited_for: int) -> None:
        """Sends the owed ack that no fetch's reply confirmed within :data:`ACK_LINGER`; while
        fetches keep confirming each one it waited for, waits for the next one instead."""
        try:
            while True:
                await asyncio.sleep(ACK_LINGER)
                if self._owed <= self._confirmed:
                    return
                if self._confirmed >= waited_for:
                    waited_for = self._owed  # a fetch carried it: wait for the next the same way
                    continue
                if self.agent.is_closed:
                    return
                async with self._ack_lock:
                    through = self._owed
                    if through > self._confirmed:
                        await self._write({"goal_id": self.goal_id, "through": through})
                if self._confirmed < through:
                    return  # not taken (logged): the next handled message lingers again
                waited_for = through
        finally:
            self._lingering = None

    async def _write(self, body: dict) -> None:
        pause = 0.1
        for attempt in range(4):
            try:
                reply = await self.agent.request(f"agent.inbox.ack.{self.agent.id}", body,
                                                 timeout=self.agent._inbox_attempt_s)
                if isinstance(reply, Mapping) and isinstance(reply.get("cursor"), int):
                    self._confirmed = max(self._confirmed, reply["cursor"])
                return
            except SwitchboardError as exc:
                if self.agent.is_closed or not exc.retryable and exc.kind != "conflict" \
                        or attempt == 3:
                    # Not written: the message is handed out again after a restart (at
                    # least once), or the next acknowledgement covers it.
                    log.warning("switchboard: acknowledging goal %s (%s) failed: %s",
                                self.goal_id, body, exc)
                    return
                await asyncio.sleep(pause)
                pause *= 4


def default_signals() -> tuple[int, ...]:
    """SIGTERM and SIGINT, where the platform has them."""
    return tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGINT", None))
                 if s is not None)
