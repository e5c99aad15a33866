"""The fabric as function-calling tools for an LLM: the 17 tools of ``switchboard mcp`` (the
same names, descriptions and JSON Schemas, generated from docs/mcp-tools.json), in the OpenAI
and Anthropic formats, and a dispatcher that runs a model's tool calls as an agent.

    from switchboard.tools import openai_tools, anthropic_tools

    tools = agent.tools                      # a Toolbox bound to the agent (one per agent)
    response = client.chat.completions.create(model=..., messages=history,
                                              tools=tools.openai())
    history.append(response.choices[0].message)
    history += await tools.run_all(response.choices[0].message.tool_calls or [])

A tool call is taken in any of three shapes, and its result comes back in the same one:

- OpenAI Chat Completions, ``message.tool_calls[i]``: ``{"id", "type": "function",
  "function": {"name", "arguments": "<JSON text>"}}`` → ``{"role": "tool", "tool_call_id",
  "content"}``;
- OpenAI Responses, an ``output`` item ``{"type": "function_call", "call_id", "name",
  "arguments"}`` → ``{"type": "function_call_output", "call_id", "output"}``;
- Anthropic Messages, a ``content`` block ``{"type": "tool_use", "id", "name", "input"}`` →
  ``{"type": "tool_result", "tool_use_id", "content", "is_error"}``.

The content is what the MCP tool returns: the service's reply as JSON (a delivery report, a
task record, a call's answer), ``check_inbox``'s ``# PEER MESSAGES`` block, or
``{"error": {"kind", "message"}}`` (``is_error`` for Anthropic). A bad call from the model —
an unknown tool, arguments that are not a JSON object, a missing or mistyped field — is such
an error result of kind ``bad_request``, never an exception: the model reads it and tries
again. Objects of the ``openai`` and ``anthropic`` packages (``model_dump()``) are taken as
well as dicts.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import json
import logging
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ._tool_specs import TOOLS as _SPECS
from .errors import SwitchboardError
from .message import Message, is_party

if TYPE_CHECKING:
    from .agent import Agent

log = logging.getLogger("switchboard")

#: Most bytes of a tool call's arguments (its JSON text) the dispatcher reads.
ARGUMENTS_MAX_BYTES = 256 * 1024
#: The tools, by name, in the order of docs/mcp-tools.json.
TOOL_NAMES: tuple[str, ...] = tuple(spec["name"] for spec in _SPECS)

_BY_NAME = {spec["name"]: spec for spec in _SPECS}
_FETCH_MAX = 64  # one page: a goal's whole inbox (FETCH_MAX of the protocol)
_CALL_TIMEOUT_MS = 30_000  # talk_to_agent's default
_CALL_TIMEOUT_MAX_MS = 300_000  # the correlator's longest wait
_LIST_LIMIT_MAX = 200  # a task listing's largest page
_UINT_MAX = {"uint32": 2**32 - 1, "uint64": 2**64 - 1}
_WAIT_MAX_S = 50  # the longest ask_person / request_approval wait for a person (wait_s)
_POLL_S = 0.5  # how often such a wait reads the item's state
# Arguments that are ids (uuids in the MCP server's parameter types).
_UUIDS = {
    "send_to_peer": ("in_reply_to", "correlation_id"),
    "reply_to_peer": ("correlation_id",),
    "message_status": ("message_id",),
    "update_task": ("task_id",),
    "spawn_subagent": ("parent_task_id",),
    "complete_task": ("task_id",),
    "subagent_status": ("task_id", "parent_task_id"),
    "cancel_task": ("task_id",),
    "use_approval": ("approval_id",),
    "read_attachment": ("ref",),
}
_RECEIPTS = ("delivered", "read")
_ATTACHMENTS_MAX = 16  # a message's most attachments (docs/protocol.md §17)
_TEXT_SHOWN_MAX = 64 * 1024  # read_attachment shows text of at most this many bytes
_TEXT_TYPES = ("application/json", "application/xml", "application/yaml", "application/toml",
               "application/csv")
# Error kinds that are not a refusal: the request may not have been taken, or was malformed.
_NOT_REFUSALS = {"bad_request", "not_found", "conflict", "unavailable", "internal", "timeout",
                 "unknown", "no_responders", "request_timeout"}

Format = Literal["chat", "responses", "anthropic"]
JSONBody = dict[str, Any]


# --------------------------------------------------------------------------- definitions
def tool_specs() -> list[dict[str, Any]]:
    """The MCP tool list as ``switchboard mcp`` serves it: ``{"name", "description",
    "inputSchema"}`` each (a copy: change it freely)."""
    return copy.deepcopy(_SPECS)


def openai_tools(*, api: Literal["chat", "responses"] = "chat") -> list[dict[str, Any]]:
    """The tools for OpenAI: Chat Completions' ``[{"type": "function", "function": {"name",
    "description", "parameters"}}]``, or with ``api="responses"`` the Responses API's flat
    ``[{"type": "function", "name", "description", "parameters"}]``."""
    if api not in ("chat", "responses"):
        raise ValueError(f"api is `chat` or `responses`, not {api!r}")
    tools = []
    for spec in tool_specs():
        function = {"name": spec["name"], "description": spec["description"],
                    "parameters": spec["inputSchema"]}
        tools.append({"type": "function", "function": function} if api == "chat"
                     else {"type": "function", **function})
    return tools


def anthropic_tools() -> list[dict[str, Any]]:
    """The tools for Anthropic's Messages API: ``[{"name", "description",
    "input_schema"}]``."""
    return [{"name": spec["name"], "description": spec["description"],
             "input_schema": spec["inputSchema"]} for spec in tool_specs()]


# --------------------------------------------------------------------------- results
@dataclass(frozen=True)
class ToolResult:
    """What one tool returned: ``content``, the text the model reads (the service's reply
    as JSON, check_inbox's block, or ``{"error": {"kind", "message"}}``), and whether it is
    an error."""

    name: str
    content: str
    is_error: bool = False

    @property
    def value(self) -> Any:
        """``content`` parsed as JSON (check_inbox's block stays text)."""
        try:
            return json.loads(self.content)
        except ValueError:
            return self.content

    @property
    def error(self) -> dict[str, str] | None:
        """``{"kind", "message"}`` of an error result; ``None`` otherwise."""
        return self.value["error"] if self.is_error else None


def _reply(name: str, value: Any) -> ToolResult:
    return ToolResult(name, json.dumps(value, indent=2, ensure_ascii=False))


def _refused(name: str, kind: str, message: str) -> ToolResult:
    body = {"error": {"kind": kind, "message": message}}
    return ToolResult(name, json.dumps(body, ensure_ascii=False, separators=(",", ":")), True)


class _BadCall(Exception):
    """A tool call the model got wrong: answered with kind ``bad_request``."""


# --------------------------------------------------------------------------- checking
_JSON_TYPES = {"string": "a string", "integer": "an integer", "boolean": "a boolean",
               "null": "null", "number": "a number", "object": "an object", "array": "an array"}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _fits(value: Any, types: list[str]) -> bool:
    kind = _json_type(value)
    return kind in types or (kind == "integer" and "number" in types)


def _arguments(raw: Any) -> dict[str, Any]:
    """The arguments of a call, as an object: JSON text (OpenAI) or an object (Anthropic)."""
    if raw is None:
        return {}
    if isinstance(raw, (str, bytes, bytearray)):
        size = len(raw.encode() if isinstance(raw, str) else raw)
        if size > ARGUMENTS_MAX_BYTES:
            raise _BadCall(f"the arguments are {size} bytes, more than the {ARGUMENTS_MAX_BYTES}"
                           " a tool call may have")
        if not raw.strip():
            return {}  # a call without arguments
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise _BadCall(f"the arguments are not JSON ({exc}); send one JSON object") from None
    elif isinstance(raw, Mapping):
        try:
            size = len(json.dumps(raw, ensure_ascii=False).encode())
        except (TypeError, ValueError) as exc:
            raise _BadCall(f"the arguments are not JSON ({exc})") from None
        if size > ARGUMENTS_MAX_BYTES:
            raise _BadCall(f"the arguments are {size} bytes, more than the {ARGUMENTS_MAX_BYTES}"
                           " a tool call may have")
    if not isinstance(raw, Mapping):
        raise _BadCall(f"the arguments must be a JSON object, not {_JSON_TYPES[_json_type(raw)]}")
    return dict(raw)


def _checked(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """``args`` checked against the tool's input schema (and the MCP server's parameter
    types: ids are uuids, receipts ``delivered`` or ``read``): every property, absent ones as
    their defaults. Unknown properties are ignored, as the MCP server does."""
    schema = _BY_NAME[name]["inputSchema"]
    properties: dict[str, Any] = schema.get("properties") or {}
    missing = [key for key in schema.get("required", ()) if key not in args]
    if missing:
        raise _BadCall(f"{name} needs " + ", ".join(f"`{key}`" for key in missing))
    out: dict[str, Any] = {}
    for key, prop in properties.items():
        if key not in args:
            out[key] = copy.deepcopy(prop.get("default"))
            continue
        value = args[key]
        types = prop.get("type", [])
        types = [types] if isinstance(types, str) else list(types)
        if types and not _fits(value, types):
            wanted = " or ".join(_JSON_TYPES.get(t, t) for t in types)
            raise _BadCall(f"`{key}` must be {wanted}, not {_JSON_TYPES[_json_type(value)]}")
        if value is not None:
            if "enum" in prop and value not in prop["enum"]:
                if name == "update_task" and value in ("cancel", "expire"):
                    raise _BadCall(f"update_task cannot `{value}` a task (its actions: "
                                   f"{', '.join(prop['enum'])}); to cancel a task you created, "
                                   "use cancel_task")
                raise _BadCall(f"`{key}` must be one of {', '.join(map(str, prop['enum']))}, "
                               f"not {value!r}")
            if "minimum" in prop and value < prop["minimum"]:
                raise _BadCall(f"`{key}` must be at least {prop['minimum']}, not {value}")
            ceiling = _UINT_MAX.get(prop.get("format", ""))
            if ceiling is not None and value > ceiling:
                raise _BadCall(f"`{key}` must be at most {ceiling}, not {value}")
        out[key] = value
    for key in _UUIDS.get(name, ()):
        if out.get(key) is not None:
            try:
                out[key] = str(uuid.UUID(out[key]))
            except ValueError:
                raise _BadCall(f"`{key}` must be an id (a UUID), not {out[key]!r}") from None
    if out.get("receipt") is not None and out["receipt"] not in _RECEIPTS:
        raise _BadCall(f"`receipt` must be \"delivered\" or \"read\", not {out['receipt']!r}")
    return out


def _parse_call(call: Any) -> tuple[Format, str, Any, Any]:
    """(format, call id, tool name, raw arguments) of a model's tool call. Raises
    ``ValueError`` for something that is no tool call at all (the host's mistake, not the
    model's)."""
    if not isinstance(call, Mapping) and hasattr(call, "model_dump"):
        call = call.model_dump()  # an object of the openai / anthropic packages
    if not isinstance(call, Mapping):
        raise ValueError(f"not a tool call: {type(call).__name__}")
    kind = call.get("type")
    if kind == "tool_use":
        return "anthropic", str(call.get("id") or ""), call.get("name"), call.get("input")
    if kind == "function_call":
        call_id = call.get("call_id") or call.get("id") or ""
        return "responses", str(call_id), call.get("name"), call.get("arguments")
    function = call.get("function")
    if isinstance(function, Mapping) and kind in (None, "function"):
        return "chat", str(call.get("id") or ""), function.get("name"), function.get("arguments")
    raise ValueError("not a tool call: expected an OpenAI tool call ({'id', 'type': 'function', "
                     "'function': {...}}), a Responses function_call or an Anthropic tool_use "
                     f"block; got the keys {sorted(call)}")


def _message(fmt: Format, call_id: str, result: ToolResult) -> dict[str, Any]:
    """The result message a model reads, in the format of the call it answers."""
    if fmt == "anthropic":
        return {"type": "tool_result", "tool_use_id": call_id, "content": result.content,
                "is_error": result.is_error}
    if fmt == "responses":
        return {"type": "function_call_output", "call_id": call_id, "output": result.content}
    return {"role": "tool", "tool_call_id": call_id, "content": result.content}


def _error_kind(exc: SwitchboardError) -> str:
    # As the MCP server says it: no responders is `unavailable`, a lost reply `timeout`.
    return {"no_responders": "unavailable", "request_timeout": "timeout"}.get(exc.kind, exc.kind)


def _open(message: Message) -> bool:
    """Whether the caller of a request still waits (its ``call_deadline`` has not passed)."""
    deadline = message.call_deadline
    if not deadline:
        return True
    try:
        at = datetime.datetime.fromisoformat(deadline.replace("Z", "+00:00"))
    except ValueError:
        return True
    return at > datetime.datetime.now(datetime.timezone.utc)


def _escape(text: str) -> str:
    """``text`` as an XML attribute value."""
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def render_peer_messages(messages: Iterable[Message]) -> str | None:
    """Messages as check_inbox shows them to a model (the ``# PEER MESSAGES`` block of
    ``<peer-message>`` elements, as the Rust client renders it); ``None`` for none. A body
    cannot close its element early: ``</peer-message`` in it is written ``<\\/peer-message``.
    A message's files are listed before its body, ``<attachment ref name media_type size/>``.
    A person's answer (from the people service, with ``from_person``) shows the person as
    its sender: ``from="person:alice"``."""
    lines = []
    for message in messages:
        raw = message.raw
        # A person's answer shows the person: only the people service (the reserved id) sets
        # `from_person`, and a valid person id holds no quote.
        sender = message.from_person or message.sender
        head = f'<peer-message from="{sender}" sent_at="{raw.get("sent_at", "")}"'
        if message.id:
            head += f' message_id="{message.id}"'
        if message.correlation_id:
            head += f' correlation_id="{message.correlation_id}"'
        if message.kind != "message":
            head += f' kind="{message.kind}"'
        task = raw.get("task")
        if isinstance(task, Mapping):
            head += f' task_id="{task.get("id", "")}" task_state="{task.get("state", "")}"'
        files = [f for f in raw.get("attachments") or [] if isinstance(f, Mapping)]
        if files:
            head += f' attachments="{len(files)}"'
        listed = "".join(
            f'<attachment ref="{f.get("ref", "")}" name="{_escape(str(f.get("name", "")))}" '
            f'media_type="{_escape(str(f.get("media_type", "")))}" size="{f.get("size", 0)}"/>\n'
            for f in files)
        # A body can neither close its element nor add a file to the message in words.
        body = (message.body.replace("</peer-message", "<\\/peer-message")
                .replace("<attachment", "<\\attachment"))
        lines.append(f"{head}>\n{listed}{body}\n</peer-message>\n")
    return "# PEER MESSAGES\n" + "".join(lines) if lines else None


# --------------------------------------------------------------------------- the toolbox
class Toolbox:
    """The tools bound to one agent (``agent.tools``): their definitions for a model, and
    :meth:`run`, which runs a model's tool call as the agent and returns the result message.

    It keeps what ``switchboard mcp`` keeps for its session: the requests ``check_inbox``
    showed that wait for an answer (``reply_to_peer`` without ``correlation_id`` answers the
    latest; ``talk_to_agent`` while one is open continues its chain) and the parts sent of an
    answer in parts. ``check_inbox`` reads and acknowledges the agent's current goal: do not
    run ``serve()`` or ``messages()`` on that goal at the same time."""

    def __init__(self, agent: "Agent"):
        self.agent = agent
        self._unanswered: list[Message] = []  # requests shown, oldest first
        self._parts: dict[str, int] = {}  # correlation id -> parts sent

    # The definitions.
    def openai(self, *, api: Literal["chat", "responses"] = "chat") -> list[dict[str, Any]]:
        """:func:`openai_tools`."""
        return openai_tools(api=api)

    def anthropic(self) -> list[dict[str, Any]]:
        """:func:`anthropic_tools`."""
        return anthropic_tools()

    # Running calls.
    async def run(self, call: Any) -> dict[str, Any]:
        """Runs one tool call of a model (an OpenAI ``tool_calls`` item, a Responses
        ``function_call`` or an Anthropic ``tool_use`` block) and returns the result message
        in the same format, to append to the conversation. Never raises over the call's
        content (a bad call is an error result); ``ValueError`` when ``call`` is no tool call
        at all."""
        fmt, call_id, name, arguments = _parse_call(call)
        return _message(fmt, call_id, await self.execute(name, arguments))

    async def run_all(self, calls: Iterable[Any] | None) -> list[dict[str, Any]]:
        """:meth:`run` for each call, one after another and in order (a model's parallel calls
        may depend on each other's order, e.g. a check_inbox before a reply_to_peer). Accepts
        ``None`` (a message without tool calls) and Anthropic ``content`` lists (only the
        ``tool_use`` blocks are run)."""
        results = []
        for call in calls or ():
            if not isinstance(call, Mapping) and hasattr(call, "model_dump"):
                call = call.model_dump()
            if isinstance(call, Mapping) and call.get("type") not in (
                    None, "function", "function_call", "tool_use"):
                continue  # text and thinking blocks, a Responses output's messages
            results.append(await self.run(call))
        return results

    async def execute(self, name: Any, arguments: Any = None) -> ToolResult:
        """Runs the tool ``name`` with ``arguments`` (JSON text or an object) as the agent:
        the format-free core of :meth:`run`."""
        if not isinstance(name, str) or name not in _BY_NAME:
            return _refused(str(name), "bad_request",
                            f"there is no tool {name!r}; the tools are {', '.join(TOOL_NAMES)}")
        try:
            args = _checked(name, _arguments(arguments))
        except _BadCall as exc:
            return _refused(name, "bad_request", str(exc))
        try:
            return await getattr(self, f"_{name}")(args)
        except _BadCall as exc:
            return _refused(name, "bad_request", str(exc))
        except SwitchboardError as exc:
            return _refused(name, _error_kind(exc), exc.message)
        except (asyncio.TimeoutError, OSError) as exc:
            return _refused(name, "transport", str(exc) or type(exc).__name__)
        except Exception as exc:  # nats-py's errors (a closed connection …) and the rest
            transport = type(exc).__module__.startswith("nats")
            if not transport:
                log.exception("switchboard: the tool %s failed", name)
            return _refused(name, "transport" if transport else "internal",
                            str(exc) or type(exc).__name__)

    # The state check_inbox leaves.
    def _last_request(self) -> Message | None:
        self._unanswered = [m for m in self._unanswered if _open(m)]
        return self._unanswered[-1] if self._unanswered else None

    def _remember(self, messages: list[Message]) -> None:
        known = {m.correlation_id for m in self._unanswered}
        for message in messages:
            if message.is_call and message.correlation_id not in known:
                self._unanswered.append(message)
                known.add(message.correlation_id)

    def _answered(self, correlation_id: str) -> None:
        self._parts.pop(correlation_id, None)
        self._unanswered = [m for m in self._unanswered if m.correlation_id != correlation_id]

    def _trace(self, correlation_id: str) -> Mapping[str, str] | None:
        for message in self._unanswered:
            if message.correlation_id == correlation_id:
                return message.trace
        return None

    async def _attachments(self, a: JSONBody, body: JSONBody) -> None:
        """The file refs of ``a["attachments"]`` as attachments on ``body`` (each stat'ed: a
        complete file this agent may pass on), as the MCP server resolves them."""
        refs = a.get("attachments") or []
        if len(refs) > _ATTACHMENTS_MAX:
            raise _BadCall(f"{len(refs)} attachments; a message carries at most "
                           f"{_ATTACHMENTS_MAX}")
        files = []
        for ref in refs:
            try:
                ref = str(uuid.UUID(ref))
            except (TypeError, ValueError, AttributeError):
                raise _BadCall(f"an attachment must be a file ref (a UUID), not {ref!r}") from None
            view = await self.agent.request(self._subject("files.stat"), {"file_id": ref})
            if view.get("state") != "complete":
                raise _BadCall(f"file {ref} is still being uploaded")
            files.append(view["attachment"])
        if files:
            body["attachments"] = files

    def _goal(self) -> JSONBody:
        return {"from_goal_id": self.agent.goal_id} if self.agent.goal_id else {}

    def _subject(self, op: str) -> str:
        return f"agent.{op}.{self.agent.id}"

    # The tools, one method each: the MCP server's tools (cli/src/mcp/tools.rs) in Python,
    # each one request (Agent.request, docs/protocol.md) whose reply is the result as is.
    async def _list_peers(self, a: JSONBody) -> ToolResult:
        body = {k: a[k] for k in ("after", "limit", "skill") if a[k] is not None}
        return _reply("list_peers", await self.agent.request(self._subject("registry.peers"),
                                                             body))

    async def _send_to_peer(self, a: JSONBody) -> ToolResult:
        if is_party(a["to"]):  # a person or a role: a note (its NoteReport), as the MCP tool
            if a.get("attachments"):
                raise _BadCall("a note to a person carries text only, no attachments")
            return _reply("send_to_peer", await self.agent.note_person(a["to"], a["message"]))
        body = {"to": a["to"], "message": a["message"], "id": str(uuid.uuid4()), **self._goal()}
        for key in ("in_reply_to", "correlation_id", "receipt"):
            if a[key] is not None:
                body[key] = a[key]
        await self._attachments(a, body)
        return _reply("send_to_peer", await self.agent.request(self._subject("send"), body))

    async def _message_status(self, a: JSONBody) -> ToolResult:
        reply = await self.agent.request(self._subject("send.status"),
                                         {"message_id": a["message_id"]})
        return _reply("message_status", reply)

    async def _talk_to_agent(self, a: JSONBody) -> ToolResult:
        # A call made while a request to this agent is open continues that request's chain
        # (the correlator refuses cycles and over-deep chains); one to the agent that asked is
        # a question back inside its call.
        serving = self._last_request()
        timeout_ms = a["timeout_ms"] if a["timeout_ms"] is not None else _CALL_TIMEOUT_MS
        body = {"to": a["to"], "message": a["message"], "timeout_ms": timeout_ms, "wait": True,
                "correlation_id": str(uuid.uuid4()), **self._goal()}
        if a["receipt"] is not None:
            body["receipt"] = a["receipt"]
        await self._attachments(a, body)
        if serving is not None:
            body["parent_correlation_id"] = serving.correlation_id
            if serving.sender == a["to"].strip() and serving.id:
                body["in_reply_to"] = serving.id
        wait = min(timeout_ms, _CALL_TIMEOUT_MAX_MS) / 1000 + self.agent.request_timeout
        answer = await self.agent.request(self._subject("call"), body, timeout=wait,
                                          trace=serving.trace if serving else None)
        return _reply("talk_to_agent", answer)

    async def _reply_to_peer(self, a: JSONBody) -> ToolResult:
        target = a["correlation_id"]
        if target is None:
            last = self._last_request()
            target = last.correlation_id if last is not None else None
        if target is None:
            pending = await self.agent.request(self._subject("calls.pending"), {})
            incoming = pending.get("incoming") or []
            if not incoming:
                return _refused("reply_to_peer", "not_found",
                                "no request is waiting for your answer; use send_to_peer to "
                                "message a peer")
            target = incoming[-1]["correlation_id"]
        trace = self._trace(target)
        files: JSONBody = {}
        await self._attachments(a, files)
        if a["partial"]:
            part = self._parts.get(target, 0) + 1
            self._parts[target] = part
            try:
                ack = await self.agent.request(
                    self._subject("reply"), {"correlation_id": target, "message": a["message"],
                                             "partial": True, "part": part, **files},
                    trace=trace)
            except SwitchboardError as exc:
                # Only a part refused outright gives its number back; one that may have been
                # taken (a timeout) keeps it, so the next part is not taken for its retry.
                if exc.kind not in _NOT_REFUSALS or exc.kind == "bad_request":
                    self._parts[target] = part - 1
                raise
            return _reply("reply_to_peer", ack)
        try:
            ack = await self.agent.request(
                self._subject("reply"),
                {"correlation_id": target, "message": a["message"], **files}, trace=trace)
        except SwitchboardError as exc:
            if exc.kind not in _NOT_REFUSALS or exc.kind == "not_found":
                self._answered(target)
            raise
        self._answered(target)
        return _reply("reply_to_peer", ack)

    async def _check_inbox(self, a: JSONBody) -> ToolResult:
        # One page of unread messages is taken (acknowledged) once the block that hands it to
        # the model is ready; a failed fetch or ack leaves them unread for the next call.
        goal = self.agent.goal_id
        if goal is None:
            raise _BadCall("this agent has no goal open, so no inbox to read")
        page = await self.agent.request(self._subject("inbox.fetch"),
                                        {"goal_id": goal, "max": _FETCH_MAX, "wait_ms": 0})
        messages = [Message(self.agent, goal, entry) for entry in page["messages"]]
        self._remember(messages)
        text = render_peer_messages(messages) or "No new messages."
        more = int(page.get("unread") or 0) - len(messages)
        if more > 0:
            text += (f"\n({more} more unread message(s): call check_inbox again to read them)")
        expired = page.get("expired_unread")
        if expired:
            text += (f"\n({expired.get('count', 0)} message(s) to you were removed unread "
                     "because your inbox was full; their senders were told)")
        if messages:
            await self.agent.request(self._subject("inbox.ack"),
                                     {"goal_id": goal, "through": messages[-1].seq})
        return ToolResult("check_inbox", text)

    async def _create_task(self, a: JSONBody) -> ToolResult:
        body = {"to": a["to"], "message": a["message"], "task_id": str(uuid.uuid4()),
                **self._goal()}
        for key in ("deadline_in_ms", "receipt"):
            if a[key] is not None:
                body[key] = a[key]
        await self._attachments(a, body)
        return _reply("create_task", await self.agent.request(self._subject("task.create"),
                                                              body))

    async def _update_task(self, a: JSONBody) -> ToolResult:
        body = {"task_id": a["task_id"], **self._goal()}
        if a["message"] is not None:
            body["message"] = a["message"]
        await self._attachments(a, body)
        reply = await self.agent.request(self._subject(f"task.{a['action']}"), body)
        return _reply("update_task", reply)

    async def _spawn_subagent(self, a: JSONBody) -> ToolResult:
        body = {"to": a["agent"] if a["agent"] is not None else "self", "message": a["message"],
                "task_id": str(uuid.uuid4()), "parent_task_id": a["parent_task_id"],
                **self._goal()}
        if a["deadline_in_ms"] is not None:
            body["deadline_in_ms"] = a["deadline_in_ms"]
        return _reply("spawn_subagent", await self.agent.request(self._subject("task.spawn"),
                                                                 body))

    async def _complete_task(self, a: JSONBody) -> ToolResult:
        body = {"task_id": a["task_id"]}
        if a["result"]:
            body["message"] = a["result"]
        await self._attachments(a, body)
        return _reply("complete_task", await self.agent.request(self._subject("task.complete"),
                                                                body))

    async def _subagent_status(self, a: JSONBody) -> ToolResult:
        if a["task_id"] is not None:
            reply = await self.agent.request(self._subject("task.get"),
                                             {"task_id": a["task_id"]})
            return _reply("subagent_status", reply["task"])
        if a["parent_task_id"] is None:
            raise _BadCall("give task_id or parent_task_id")
        tasks: list = []
        cursor = None
        while True:
            filters: JSONBody = {"parent": a["parent_task_id"], "limit": _LIST_LIMIT_MAX}
            if cursor:
                filters["cursor"] = cursor
            page = await self.agent.request(self._subject("task.list"), filters)
            tasks.extend(page["tasks"])
            cursor = page.get("next_cursor")
            if not cursor:
                return _reply("subagent_status", tasks)

    async def _cancel_task(self, a: JSONBody) -> ToolResult:
        body = {"task_id": a["task_id"]}
        if a["reason"] is not None:
            body["message"] = a["reason"]
        return _reply("cancel_task", await self.agent.request(self._subject("task.cancel"),
                                                              body))

    async def _read_attachment(self, a: JSONBody) -> ToolResult:
        holder: JSONBody = {}
        await self._attachments({"attachments": [a["ref"]]}, holder)
        attachment = holder["attachments"][0]
        media_type = str(attachment["media_type"]).lower()
        text = (media_type.startswith("text/") or media_type.endswith(("+json", "+xml"))
                or media_type in _TEXT_TYPES)
        if not text or attachment["size"] > _TEXT_SHOWN_MAX:
            note = (f"not shown: {attachment['media_type']} of {attachment['size']} bytes "
                    f"(text of at most {_TEXT_SHOWN_MAX} bytes is shown)")
            return _reply("read_attachment", {"attachment": attachment, "note": note})
        data = await self.agent.read_attachment(attachment)
        try:
            return _reply("read_attachment", {"attachment": attachment, "text": data.decode()})
        except UnicodeDecodeError:
            return _reply("read_attachment", {"attachment": attachment,
                                              "note": "not shown: the bytes are not UTF-8 text"})

    async def _pending_requests(self, a: JSONBody) -> ToolResult:
        return _reply("pending_requests",
                      await self.agent.request(self._subject("calls.pending"), {}))

    # The people tools (cli/src/mcp/people.rs): seconds in the arguments, milliseconds on the
    # wire. ask_person and request_approval return the item's summary, after waiting up to
    # `wait_s` (at most 50 s) for a person to answer.
    def _answer_goal(self) -> str:
        if self.agent.goal_id is None:
            raise _BadCall("this agent has no goal open, so no inbox for the answer")
        return self.agent.goal_id

    async def _list_people(self, a: JSONBody) -> ToolResult:
        return _reply("list_people", await self.agent.people())

    async def _ask_person(self, a: JSONBody) -> ToolResult:
        parked = await self.agent.ask_person(
            a["to"], a["question"], goal_id=self._answer_goal(), timeout_ms=_ms(a["timeout_s"]),
            escalate_after_ms=_ms(a["escalate_after_s"]), escalate_to=a["escalate_to"])
        return await self._wait_for_person("ask_person", parked.item_id, a["wait_s"])

    async def _request_approval(self, a: JSONBody) -> ToolResult:
        parked = await self.agent.request_approval(
            a["tool"], a["arguments"], a["reason"], a["to"], _ms(a["expires_in_s"]),
            escalate_after_ms=_ms(a["escalate_after_s"]), escalate_to=a["escalate_to"],
            goal_id=self._answer_goal())
        return await self._wait_for_person("request_approval", parked.item_id, a["wait_s"])

    async def _use_approval(self, a: JSONBody) -> ToolResult:
        return _reply("use_approval", await self.agent.use_approval(
            a["approval_id"], a["tool"], a["arguments"]))

    async def _wait_for_person(self, name: str, item_id: str, wait_s: int | None) -> ToolResult:
        """Reads item ``item_id`` until it leaves ``open`` / ``escalated`` or ``wait_s`` (at
        most 50 s) passed; its summary either way."""
        loop = asyncio.get_running_loop()
        until = loop.time() + min(wait_s or 0, _WAIT_MAX_S)
        while True:
            item = await self.agent.person_item(item_id)
            if item.state not in ("open", "escalated") or loop.time() >= until:
                return _reply(name, _summary(item))
            await asyncio.sleep(_POLL_S)


def _ms(seconds: int | None) -> int | None:
    """Seconds as the wire's milliseconds (at most 2^64 − 1, as the MCP server saturates)."""
    return None if seconds is None else min(seconds * 1000, _UINT_MAX["uint64"])


def _summary(item: Mapping[str, Any]) -> JSONBody:
    """What a waiting people tool returns: the item's id, state, to and addressee and, once
    answered, who answered what (and an approval's decision and hash); keys in order, as the
    MCP server writes them."""
    out: JSONBody = {"item_id": item["item_id"], "state": item["state"], "to": item["to"],
                     "addressee": item["addressee"]}
    # What the model calls it: the approval_id use_approval takes, or the ask's id.
    out["approval_id" if item.get("kind") == "approval" else "ask_id"] = item["item_id"]
    answer = item.get("answer")
    if answer:
        out["answered_by"] = answer.get("by")
        out["answer"] = answer.get("message")
        if answer.get("decision") is not None:
            out["decision"] = answer["decision"]
    if item.get("action_hash") is not None:
        out["action_hash"] = item["action_hash"]
    return dict(sorted(out.items()))


__all__ = ["ARGUMENTS_MAX_BYTES", "TOOL_NAMES", "ToolResult", "Toolbox", "anthropic_tools",
           "openai_tools", "render_peer_messages", "tool_specs"]
