"""A reference A2A agent built with the official Python SDK (a2a-sdk): it echoes each message
as a completed task's artifact (`echo: <text>`). `make bench` measures a blocking SendMessage
to it beside the same exchange through the Switchboard gateway, on the same machine, and
tests/a2a_outbound.rs carries Switchboard agents' messages to it. A few texts act:

- `slow`: a working status with the note `halfway`, 300 ms, then the echo;
- `ask: <question>`: asks `<question>` (input-required); the answer in the same task is
  echoed as `answered: <answer>`;
- `fail`: the task fails with `cannot do that`;
- `trace`: answers the `traceparent` header its request carried.

Usage: a2a_echo_server.py --port PORT [--tls DIR] (serves the card at
/.well-known/agent-card.json and JSON-RPC at /; stops on SIGTERM). With `--tls DIR` it serves
https with a certificate for 127.0.0.1 from a CA of its own, made at start with the pinned
`cryptography`, and writes the CA to DIR/ca.pem for the client to trust.
"""

import argparse
import asyncio
import contextvars

import uvicorn
from a2a.helpers import new_task
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Part,
    TaskState,
)
from starlette.applications import Starlette


TRACEPARENT = contextvars.ContextVar("traceparent", default="")


class Echo(AgentExecutor):
    """Answers every message with `echo: <text>` as the task's artifact."""

    async def execute(self, context: RequestContext, queue: EventQueue) -> None:
        text = context.get_user_input()
        answering = context.current_task is not None and (
            context.current_task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        )
        if context.current_task is None:
            await queue.enqueue_event(
                new_task(
                    context.task_id,
                    context.context_id,
                    TaskState.TASK_STATE_SUBMITTED,
                    history=[context.message],
                )
            )
        updater = TaskUpdater(queue, context.task_id, context.context_id)
        note = None
        if text == "slow":
            note = updater.new_agent_message([Part(text="halfway")])
        await updater.start_work(note)
        if text == "slow":
            await asyncio.sleep(0.3)
        if answering:
            answer = f"answered: {text}"
        elif text.startswith("ask: "):
            question = updater.new_agent_message([Part(text=text[len("ask: ") :])])
            await updater.requires_input(question)
            return
        elif text == "fail":
            await updater.failed(updater.new_agent_message([Part(text="cannot do that")]))
            return
        elif text == "trace":
            answer = TRACEPARENT.get()
        else:
            answer = f"echo: {text}"
        await updater.add_artifact([Part(text=answer)])
        await updater.complete()

    async def cancel(self, context: RequestContext, queue: EventQueue) -> None:
        await TaskUpdater(queue, context.task_id, context.context_id).cancel()


def make_certificates(directory: str) -> tuple[str, str]:
    """A CA (written to DIR/ca.pem) and a server certificate for 127.0.0.1 signed by it;
    returns the paths of the server's certificate and key."""
    import datetime
    import ipaddress
    import os

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "switchboard test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    paths = {name: os.path.join(directory, name) for name in ("ca.pem", "cert.pem", "key.pem")}
    with open(paths["cert.pem"], "wb") as out:
        out.write(cert.public_bytes(pem))
    with open(paths["key.pem"], "wb") as out:
        out.write(
            key.private_bytes(
                pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    # Written last: its presence tells the test the server's files are ready.
    with open(paths["ca.pem"] + ".tmp", "wb") as out:
        out.write(ca.public_bytes(pem))
    os.replace(paths["ca.pem"] + ".tmp", paths["ca.pem"])
    return paths["cert.pem"], paths["key.pem"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tls", metavar="DIR")
    args = parser.parse_args()
    scheme = "https" if args.tls else "http"
    card = AgentCard(
        name="echo",
        description="echoes each message",
        version="1.0",
        supported_interfaces=[
            AgentInterface(
                url=f"{scheme}://127.0.0.1:{args.port}/",
                protocol_binding="JSONRPC",
                protocol_version="1.0",
            )
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="echo", description="echo", tags=["echo"])],
    )
    handler = DefaultRequestHandler(
        agent_executor=Echo(), task_store=InMemoryTaskStore(), agent_card=card
    )
    app = Starlette(routes=create_agent_card_routes(card) + create_jsonrpc_routes(handler, "/"))

    async def remember_traceparent(scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            TRACEPARENT.set(headers.get(b"traceparent", b"").decode())
        await app(scope, receive, send)

    tls = {}
    if args.tls:
        cert, key = make_certificates(args.tls)
        tls = {"ssl_certfile": cert, "ssl_keyfile": key}
    uvicorn.run(
        remember_traceparent, host="127.0.0.1", port=args.port, log_level="warning", **tls
    )


if __name__ == "__main__":
    main()
