#!/usr/bin/env python3
"""A Switchboard agent in Python, written against docs/protocol.md only.

Dependencies: nats-py and the standard library. No Switchboard code is used; every subject,
body field and header below is the documented wire contract ("§n" = section n of
docs/protocol.md). Each line this prints on stdout is one JSON object (see README.md).

Traces (optional): with the OpenTelemetry SDK installed (`opentelemetry-sdk`,
`opentelemetry-exporter-otlp-proto-http`) and OTEL_EXPORTER_OTLP_ENDPOINT set, the agent
exports its own spans under its id as service.name: its start is a trace rooted at its span,
and each message it handles is a span in the sender's trace (§1 "Trace context").

    python agent.py --nats-url nats://127.0.0.1:4222 --agent py-echo \
                    [--description TEXT] [--max-handled N]
"""

import argparse
import asyncio
import json
import signal
import sys
import uuid

import contextlib
import os

import nats
from nats.errors import NoRespondersError

try:  # optional: traces (see the module docstring)
    from opentelemetry import propagate, trace as otel
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
except ImportError:
    otel = None


class Tracing:
    """This agent's spans, exported by OTLP when the SDK is installed and an endpoint is set;
    otherwise nothing happens and requests carry only an inbound message's trace context."""

    def __init__(self, agent_id):
        self.provider = None
        if agent_id is None or otel is None or not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            return
        self.provider = TracerProvider(resource=Resource.create({"service.name": agent_id}))
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self.tracer = self.provider.get_tracer("switchboard-example")

    def span(self, name, kind="internal", trace=None, **attributes):
        """A span named `name`, the child of `trace` (an inbound message's traceparent and
        tracestate) when given, else a new trace rooted here."""
        if self.provider is None:
            return contextlib.nullcontext()
        parent = propagate.extract(trace or {})
        kinds = {"internal": otel.SpanKind.INTERNAL, "consumer": otel.SpanKind.CONSUMER,
                 "producer": otel.SpanKind.PRODUCER}
        return self.tracer.start_as_current_span(name, context=parent, kind=kinds[kind],
                                                 attributes=attributes)

    def headers(self, trace):
        """What a request carries: the current span's context when this agent traces and a
        span is open (§1), else the inbound message's, else nothing."""
        if self.provider is not None and otel.get_current_span().get_span_context().is_valid:
            carrier = {}
            propagate.inject(carrier)
            return carrier
        return {name: trace[name] for name in ("traceparent", "tracestate")
                if trace and trace.get(name)}

    def shutdown(self):
        if self.provider is not None:
            self.provider.shutdown()

HEARTBEAT_EVERY_S = 10.0  # §4.2: "send one every 10 s" (offline after 30 s of silence)
REQUEST_TIMEOUT_S = 10.0  # a send may retry a goal's delivery for up to 8 s (§8)
FETCH_BATCH = 10
FETCH_WAIT_MS = 1000  # a held fetch (long-poll), so a stop signal is noticed within a second
# §2 "Error kinds": these say "retry" (plus the two client-side kinds of Agent.request)
RETRY_KINDS = {"unavailable", "conflict", "no_responders", "request_timeout"}


def emit(event, **fields):
    """One JSON line on stdout, flushed, so a parent process can follow along."""
    print(json.dumps({"event": event, **fields}), flush=True)


class ServiceError(Exception):
    """An error reply (§2): {"error": {"code", "kind", "message"}} plus micro headers."""

    def __init__(self, kind, code, message):
        super().__init__(message)
        self.kind, self.code, self.message = kind, code, message


class Agent:
    def __init__(self, nc, agent_id, tracing=None):
        self.nc, self.me = nc, agent_id
        self.tracing = tracing or Tracing(None)

    async def request(self, subject, body, trace=None):
        """One service request (§1 "Bodies": JSON in, JSON out) -> the success body as a dict.

        `trace` is the inbound message's headers: its traceparent/tracestate are carried
        so the service's span joins the sender's trace (§1 "Trace context") — through this
        agent's own span when it exports spans. Without either the request goes without: a
        made-up parent would leave the service's span under a parent nobody ever sees (the
        service starts the trace; heartbeats, fetches and acks start none).
        """
        headers = self.tracing.headers(trace)
        try:
            msg = await self.nc.request(subject, json.dumps(body).encode(),
                                        timeout=REQUEST_TIMEOUT_S, headers=headers or None)
        except NoRespondersError:  # §2, last paragraph: the service is not running
            raise ServiceError("no_responders", 503, f"no service answers on {subject}")
        except asyncio.TimeoutError:  # nats-py's TimeoutError is a subclass
            raise ServiceError("request_timeout", 504, f"no reply on {subject} in time")
        try:
            data, hdrs = json.loads(msg.data or b"{}"), msg.headers or {}
        except ValueError:
            raise ServiceError("bad_reply", 502, f"the reply on {subject} is not JSON")
        # §2: an error has the Nats-Service-Error-Code header and a top-level "error" object.
        # Match on `kind`; fall back on `code` for kinds this client does not know.
        if "Nats-Service-Error-Code" in hdrs or "error" in data:
            err = data.get("error") or {}
            raise ServiceError(err.get("kind", "unknown"),
                               err.get("code", hdrs.get("Nats-Service-Error-Code")),
                               err.get("message", hdrs.get("Nats-Service-Error", "")))
        return data

    # §4.1-§4.5: the directory. The caller's id is always the subject's last token (§1).
    async def register(self, description):
        card = {"description": description, "capabilities": ["echo"]}  # card fields: §5
        return await self.request(f"agent.registry.register.{self.me}", card)

    async def heartbeat(self):
        return await self.request(f"agent.registry.heartbeat.{self.me}", {})

    async def open_goal(self):  # -> {goal_id, subject}
        return await self.request(f"agent.registry.goal.open.{self.me}", {"kind": "daemon"})

    # §7 "Reading an inbox": two requests to the inbox service, never JetStream.
    async def fetch(self, goal_id, max_messages, wait_ms, ack_through=None):
        """-> {goal_id, cursor, messages: [{seq, message, traceparent?, tracestate?}], unread}"""
        body = {"goal_id": goal_id, "max": max_messages, "wait_ms": wait_ms}
        if ack_through is not None:
            body["ack_through"] = ack_through  # "I am done through N", committed first
        return await self.request(f"agent.inbox.fetch.{self.me}", body)

    async def ack(self, goal_id, through):
        return await self.request(f"agent.inbox.ack.{self.me}", {"goal_id": goal_id,
                                                                 "through": through})

    async def reject(self, goal_id, seq, reason):
        return await self.request(f"agent.inbox.ack.{self.me}", {"goal_id": goal_id, "seq": seq,
                                                                 "reject": reason})

    async def close_goal(self, goal_id):
        return await self.request(f"agent.registry.goal.close.{self.me}", {"goal_id": goal_id})

    async def deregister(self):
        return await self.request(f"agent.registry.deregister.{self.me}", {})

    # §9 "Answering": reply_to_peer names only the call's correlation_id.
    async def reply(self, correlation_id, text, trace):
        body = {"correlation_id": correlation_id, "message": text}
        return await self.request(f"agent.reply.{self.me}", body, trace)

    # §8 send_to_peer -> a DeliveryReport {message_id?, delivered_to, unreachable_reasons}.
    async def send(self, to, text, goal_id, inbound, trace):
        # §8 "Delivery, retries and de-duplication": we choose the message id, derived from
        # the inbound message, so handling that message again re-sends an id stored once.
        msg_id = uuid.uuid5(uuid.NAMESPACE_URL, f"{self.me}/{inbound.get('id', uuid.uuid4())}")
        body = {
            "to": to,
            "message": text,
            "id": str(msg_id),
            "from_goal_id": goal_id,  # where answers to this message should go
        }
        if inbound.get("id"):
            body["in_reply_to"] = inbound["id"]
        # §8 "Forwarding": pass the hop budget on, so two auto-responders cannot ping-pong
        # forever. Not `trace`: it holds the sender, and sending back to it would be a `loop`.
        if "ttl" in inbound:
            body["ttl"] = inbound["ttl"]
        return await self.request(f"agent.send.{self.me}", body, trace)


async def heartbeat_loop(agent):
    """§4.2 / §6 "Offline detection": stay online while the agent runs."""
    while True:
        await asyncio.sleep(HEARTBEAT_EVERY_S)
        try:
            await agent.heartbeat()
        except ServiceError as e:
            emit("error", kind=e.kind, message=e.message)


def decode(entry):
    """An InboxMessage (§7 "The message"): only the seed fields are sure to be there."""
    m = entry.get("message")
    if not isinstance(m, dict) or not isinstance(m.get("from_agent_id"), str) \
            or not isinstance(m.get("body"), str):
        raise ValueError("not an InboxMessage")
    return m


async def handle(agent, goal_id, m, headers):
    """One inbox message. Absent kind = "message", absent expects_reply = false (§7)."""
    kind, sender = m.get("kind", "message"), m["from_agent_id"]
    emit("received", **{"kind": kind, "from": sender, "message": m["body"],
                        "correlation_id": m.get("correlation_id")})
    if kind == "request" and m.get("expects_reply") and m.get("correlation_id"):
        # §9 "What the callee sees": a call's question; answer it by correlation id.
        ack = await agent.reply(m["correlation_id"], f"{agent.me} answers: {m['body']}", headers)
        emit("answered", correlation_id=m["correlation_id"], reply=ack)
    elif kind == "message" and sender != agent.me:
        # A peer speaking. Responses, timeout notices (kind notify) and task messages are
        # only printed: answering those would start conversations nobody asked for.
        report = await agent.send(sender, f"{agent.me} got: {m['body']}", goal_id, m, headers)
        emit("sent", to=sender, report=report)


async def run(args):
    # §8: an agent's replies arrive under _INBOX.<agent_id> (the only inboxes the generated
    # NATS config lets it subscribe to), and it signs in with its own NKey seed when given one.
    options = {"name": f"py-agent-{args.agent}", "inbox_prefix": f"_INBOX.{args.agent}"}
    if args.nkey:
        options["nkeys_seed"] = args.nkey
    nc = await nats.connect(args.nats_url, **options)
    tracing = Tracing(args.agent)
    agent = Agent(nc, args.agent, tracing)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)

    try:
        with tracing.span(f"{args.agent}: start", **{"switchboard.agent_id": args.agent}):
            await agent.register(args.description)  # §4.1 (registering counts as a heartbeat)
            goal = await agent.open_goal()  # §4.4
    except ServiceError as e:
        emit("error", kind=e.kind, message=e.message)
        await nc.close()
        return 1
    beats = asyncio.create_task(heartbeat_loop(agent))
    goal_id = goal["goal_id"]
    emit("ready", agent_id=args.agent, goal_id=goal_id)

    # §7 "Reading an inbox": fetch (held up to a second when nothing is unread), handle, ack.
    # What is fetched and not acked is handed out again by the next fetch, so a crash loses
    # nothing: the agent simply fetches again.
    handled = 0
    while not stop.is_set() and (args.max_handled is None or handled < args.max_handled):
        left = FETCH_BATCH if args.max_handled is None else args.max_handled - handled
        batch = min(FETCH_BATCH, left)  # never take more than --max-handled leaves to do
        try:
            page = await agent.fetch(goal_id, batch, FETCH_WAIT_MS)
        except ServiceError as e:  # the inbox service restarting: try again shortly
            emit("error", kind=e.kind, message=e.message)
            await asyncio.sleep(0.5)
            continue
        for entry in page["messages"]:
            seq = entry["seq"]
            # The sender's trace context travels with each message (§1 "Trace context").
            trace = {k: entry[k] for k in ("traceparent", "tracestate") if entry.get(k)}
            try:
                m = decode(entry)
            except ValueError as e:  # not an InboxMessage: reject it, or it comes back (§7)
                emit("error", kind="bad_message", message=str(e))
                await agent.reject(goal_id, seq, str(e))
                continue
            try:
                # In the sender's trace: this agent's handling span, then its requests.
                with tracing.span("process agent.inbox", "consumer", trace,
                                  **{"messaging.system": "nats",
                                     "messaging.operation.type": "process",
                                     "switchboard.agent_id": args.agent}):
                    await handle(agent, goal_id, m, trace)
            except ServiceError as e:  # refused reply or send: report it, keep going
                emit("error", kind=e.kind, message=e.message)
                if e.kind in RETRY_KINDS:  # worth another try: not acked, so it comes back
                    await asyncio.sleep(2)
                    break
            # After handling: the cursor moves through this message (§7). A repeated hand-out
            # after a crash is harmless here: a repeated send reuses its id (stored once) and
            # a repeated reply changes nothing (`duplicate: true`).
            await agent.ack(goal_id, seq)
            handled += 1

    # Leave cleanly: close the goal (§4.5: its inbox is purged), then deregister (§4.3).
    beats.cancel()
    for step in (lambda: agent.close_goal(goal_id), agent.deregister):
        try:
            await step()
        except ServiceError as e:
            emit("error", kind=e.kind, message=e.message)
    await nc.close()
    tracing.shutdown()  # flushes what is left to export
    emit("stopped")
    return 0


def main():
    p = argparse.ArgumentParser(description="A Switchboard echo agent using only nats-py.")
    p.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    p.add_argument("--agent", default="py-echo", help="agent_id: 1-64 of [a-z0-9_-] (§1)")
    p.add_argument("--description", default="echo agent written in Python with nats-py")
    p.add_argument("--nkey", default=None,
                   help="NKey seed file (switchboard nats-config writes agents/<agent_id>.nk)")
    p.add_argument("--max-handled", type=int, default=None,
                   help="stop after handling this many inbox messages")
    sys.exit(asyncio.run(run(p.parse_args())))


if __name__ == "__main__":
    main()
