"""The error kinds of docs/protocol.md §2 as one exception hierarchy.

Every refusal a service sends is ``{"error": {"code", "kind", "message"}}``; the SDK raises
the class of its kind. Catch a family (``NotFound``, ``Busy``, ``Unavailable``…) to decide what
to do, or :class:`SwitchboardError` for all; ``kind``, ``code`` and ``message`` are always
there. One class is not a service's refusal: :class:`CallFailed`, a callee that answered a
call with an error (its handler raised).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import wire


class SwitchboardError(Exception):
    """A request a service refused, or one no service answered."""

    #: The kinds this class stands for (docs/protocol.md §2, "Error kinds").
    kinds: tuple[str, ...] = ()
    #: Whether the same request may simply be sent again (the service says so).
    retryable = False

    def __init__(self, kind: str, code: int, message: str):
        super().__init__(f"{kind} ({code}): {message}")
        self.kind, self.code, self.message = kind, code, message


class BadRequest(SwitchboardError):
    """The request itself is wrong: fix it, do not retry it as it is."""

    kinds = ("bad_request", "invalid_agent_id", "invalid_goal_id", "missing_to", "self_send",
             "empty_message", "body_too_large", "broadcast_too_large", "file_too_large",
             "digest_mismatch", "quota_exceeded")


class AccessDenied(SwitchboardError):
    """A rule says no: ACLs, identity, who may act on a task or answer a call; a person
    denied the approval."""

    kinds = ("identity_mismatch", "bad_reply_subject", "not_callee", "not_allowed",
             "acl_denied", "sender_mismatch", "approval_denied", "not_addressee")


class NotFound(SwitchboardError):
    """No such thing for you: an agent, goal, call or task (another's looks the same)."""

    kinds = ("not_registered", "not_found", "unreachable")


class Conflict(SwitchboardError):
    """The state forbids it (a task that ended, a cycle, an approval not decided or used
    already, or for another action), or a race was lost (retry)."""

    kinds = ("conflict", "task_terminal", "illegal_transition", "cycle", "depth_exceeded",
             "action_mismatch", "approval_pending", "approval_used", "already_answered")


class Busy(SwitchboardError):
    """Over a cap or a budget: back off, then retry."""

    kinds = ("at_capacity", "too_many_children", "too_many_calls", "too_many_goals",
             "rate_limited", "inbox_full", "limited")
    retryable = True


class BudgetExhausted(SwitchboardError):
    """The budget the work draws on has nothing left (§16): finish with what you have; do not
    retry the same sub-work."""

    kinds = ("budget_exhausted",)


class Expired(SwitchboardError):
    """A deadline passed: the call or task is over; the answer was not delivered."""

    kinds = ("expired",)


class CallTimeout(SwitchboardError):
    """A waiting call got no answer by its deadline."""

    kinds = ("timeout",)


class CallFailed(SwitchboardError):
    """The callee answered, with an error instead of an answer (§9, ``error`` on a reply):
    its handler raised (kind ``handler_error``, what the SDKs' ``serve`` sends) or it chose to
    fail (``message.reply_error(...)``). Not the fabric's refusal: ``kind`` is the callee's
    word (1–64 characters of ``[a-z0-9_]``), ``message`` its text (at most 1024 characters),
    ``code`` is always 502. ``answer`` is the whole ``wire.CallAnswer`` (``correlation_id``,
    ``from_agent_id``, ``answered_at``, ``error``), ``callee`` who answered. Do not retry it
    as it is: the callee will likely fail again."""

    code_for_callee_errors = 502

    def __init__(self, kind: str, message: str, *, callee: str | None = None,
                 answer: Mapping[str, Any] | None = None):
        super().__init__(kind, self.code_for_callee_errors, message)
        self.callee = callee
        self.answer: wire.CallAnswer = wire.CallAnswer(answer or {})
        self.correlation_id: str | None = self.answer.get("correlation_id")

    def __str__(self) -> str:
        who = f"`{self.callee}` failed" if self.callee else "the callee failed"
        return f"{who}: {self.kind}: {self.message}"

    @classmethod
    def from_answer(cls, answer: Mapping[str, Any]) -> "CallFailed | None":
        """The exception an answer carrying ``error`` stands for, or ``None`` for a real
        answer. Takes a ``CallAnswer`` (a waiting call, ``call_stream``'s last item, a
        read-back) or a ``kind: response`` inbox message's JSON (a parked call)."""
        error = answer.get("error")
        if not isinstance(error, Mapping):
            return None
        return cls(str(error.get("kind") or "unknown"), str(error.get("message") or ""),
                   callee=answer.get("from_agent_id"), answer=answer)


class Unavailable(SwitchboardError):
    """The fabric could not do it now (a service down, no responders, a lost connection).
    Safe to retry the same request (a send with the same id is stored once)."""

    kinds = ("unavailable", "no_responders", "request_timeout")
    retryable = True


class Internal(SwitchboardError):
    """A service failed (its log says why), or it sent a kind this SDK does not know."""

    kinds = ("internal", "unknown")


_BY_KIND = {kind: cls for cls in (BadRequest, AccessDenied, NotFound, Conflict, Busy, Expired,
                                  CallTimeout, Unavailable, Internal, BudgetExhausted)
            for kind in cls.kinds}


def error_for(kind: str, code: int, message: str) -> SwitchboardError:
    """The exception for an error reply of ``kind`` (unknown kinds are :class:`Internal`)."""
    return _BY_KIND.get(kind, Internal)(kind, code, message)
