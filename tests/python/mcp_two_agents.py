"""Two MCP agents talk through Switchboard, driven by the official MCP Python SDK.

Run by cli/tests/mcp.rs: `python mcp_two_agents.py <switchboard binary> <nats url>`. It starts
`switchboard mcp --agent mcp-alice` and `--agent mcp-bob` as stdio MCP servers (exactly as an
agent host would), then, as each agent's host:

1. lists the tools (every seed tool with a description and an input schema);
2. alice: list_peers finds bob; bob subscribes to the inbox resource;
3. alice send_to_peer bob -> a delivery report naming bob's goal; bob is told (resource
   update and log notification) and check_inbox shows alice's message in a <peer-message>;
4. alice talk_to_agent bob (waits) while bob check_inbox sees the request and reply_to_peer
   answers it with no target -> alice's tool result is bob's answer;
5. errors come back as tool errors with a kind: a send to an unknown agent is reported
   unreachable, a bad task id and a reply with nothing pending are refused with kinds;
6. files (docs/protocol.md §17; each server has a files folder, `--files-dir`): alice uploads
   a file from hers and sends it by ref, bob's check_inbox lists it, read_attachment shows its
   text and save_attachment writes it into bob's folder, never over a file there; a path out
   of the folder (`..`, an absolute path, a link) or a name that is a path is refused.

It prints one JSON object with what it saw (the Rust test asserts on it too) and exits non-zero
on the first failed expectation.
"""

import asyncio
import json
import os
import sys
import tempfile

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

SEED_TOOLS = {
    "list_peers",
    "send_to_peer",
    "talk_to_agent",
    "reply_to_peer",
    "check_inbox",
    "create_task",
    "update_task",
    "spawn_subagent",
    "complete_task",
    "subagent_status",
    "cancel_task",
    "pending_requests",
    "message_status",
}
INBOX = "switchboard://inbox"


def text_of(result):
    return "".join(block.text for block in result.content if getattr(block, "type", "") == "text")


def expect(condition, what):
    if not condition:
        raise AssertionError(what)


class Host:
    """One agent host: an MCP client session plus the notifications it received."""

    def __init__(self, name):
        self.name = name
        self.events = asyncio.Queue()
        self.log_messages = []

    async def on_message(self, message):
        kind = type(message).__name__
        root = getattr(message, "root", message)
        method = getattr(root, "method", "")
        if method == "notifications/resources/updated" or kind == "ResourceUpdatedNotification":
            await self.events.put(("resource_updated", root.params.uri))

    async def on_log(self, params):
        self.log_messages.append(params.data)
        await self.events.put(("log", params.data))

    async def wait_for(self, wanted, seconds=15):
        deadline = asyncio.get_running_loop().time() + seconds
        while True:
            left = deadline - asyncio.get_running_loop().time()
            expect(left > 0, f"{self.name}: no {wanted} notification within {seconds}s")
            kind, data = await asyncio.wait_for(self.events.get(), left)
            if kind == wanted:
                return data


async def call(session, tool, args=None):
    result = await session.call_tool(tool, args or {})
    return result.is_error, text_of(result)


async def main(binary, nats_url, key_dir=None):
    report = {}

    folders = {"mcp-alice": tempfile.mkdtemp(), "mcp-bob": tempfile.mkdtemp()}

    def server(agent, description):
        args = ["mcp", "--agent", agent, "--description", description, "--nats-url", nats_url,
                "--files-dir", folders[agent]]
        if key_dir:
            # Under the generated accounts each agent signs in with its own NKey seed.
            args += ["--nkey", os.path.join(key_dir, f"{agent}.nk")]
        # The MCP SDK gives a server only a few variables of its own: pass the OpenTelemetry
        # ones on (tests/observability.rs collects the servers' spans).
        env = {"RUST_LOG": "warn"}
        env.update({k: v for k, v in os.environ.items() if k.startswith("OTEL_")})
        return StdioServerParameters(command=binary, args=args, env=env)

    alice, bob = Host("alice"), Host("bob")
    async with stdio_client(server("mcp-alice", "asks questions")) as (ar, aw), \
            stdio_client(server("mcp-bob", "answers questions")) as (br, bw), \
            ClientSession(ar, aw, message_handler=alice.on_message,
                          logging_callback=alice.on_log) as a, \
            ClientSession(br, bw, message_handler=bob.on_message,
                          logging_callback=bob.on_log) as b:
        init = await a.initialize()
        await b.initialize()
        report["server_name"] = init.server_info.name
        expect("list_peers" in (init.instructions or ""), "instructions mention the tools")

        # 1. The tools, each described for an LLM, with a JSON Schema.
        tools = (await a.list_tools()).tools
        names = {tool.name for tool in tools}
        expect(SEED_TOOLS <= names, f"missing tools: {SEED_TOOLS - names}")
        for tool in tools:
            expect(len(tool.description or "") > 40, f"{tool.name} has a real description")
            expect(tool.input_schema.get("type") == "object", f"{tool.name} has an object schema")
        send_schema = next(t for t in tools if t.name == "send_to_peer").input_schema
        expect(set(send_schema.get("required", [])) == {"to", "message"}, str(send_schema))
        report["tools"] = sorted(names)

        # 2. Discovery, and bob listens for new messages.
        error, peers = await call(a, "list_peers")
        expect(not error and "mcp-bob" in peers, f"list_peers: {peers}")
        await b.subscribe_resource(INBOX)
        resources = (await b.list_resources()).resources
        expect(any(str(r.uri) == INBOX for r in resources), f"resources: {resources}")

        # 3. A message: a delivery report, a notification, the <peer-message> block.
        error, delivery = await call(a, "send_to_peer", {"to": "mcp-bob", "message": "hello bob"})
        expect(not error, f"send_to_peer: {delivery}")
        delivery = json.loads(delivery)
        expect(len(delivery["delivered_to"]) == 1, f"one goal of bob got it: {delivery}")
        report["delivery"] = delivery
        uri = await bob.wait_for("resource_updated")
        expect(str(uri) == INBOX, uri)
        await bob.wait_for("log")
        read = await b.read_resource(INBOX)
        waiting = json.loads(read.contents[0].text)["waiting"]
        expect(waiting >= 1, f"inbox resource: {read}")
        error, inbox = await call(b, "check_inbox")
        expect(not error and 'from="mcp-alice"' in inbox and "hello bob" in inbox, inbox)
        report["bob_inbox"] = inbox
        error, again = await call(b, "check_inbox")
        expect(again == "No new messages.", f"a message is shown once: {again}")

        # 4. A call: alice waits while bob reads the request and answers with no target.
        asking = asyncio.create_task(call(a, "talk_to_agent", {
            "to": "mcp-bob", "message": "what is 2+2?", "timeout_ms": 20000}))
        await bob.wait_for("log")
        error, request = await call(b, "check_inbox")
        expect(not error and 'kind="request"' in request and "what is 2+2?" in request, request)
        report["request_inbox"] = request
        error, pending = await call(b, "pending_requests")
        expect(not error and len(json.loads(pending)["incoming"]) == 1, pending)
        error, ack = await call(b, "reply_to_peer", {"message": "4, says bob"})
        expect(not error, f"reply_to_peer: {ack}")
        error, answer = await asking
        expect(not error and "4, says bob" in answer, f"talk_to_agent: {answer}")
        report["answer"] = json.loads(answer)

        # 4b. A streamed answer: bob answers in two parts; alice's host hears the first as a
        # progress notification, and the result is the whole answer.
        progress = []

        async def on_progress(value, total, message):
            progress.append((value, message))

        asking = asyncio.create_task(a.call_tool(
            "talk_to_agent", {"to": "mcp-bob", "message": "spell it out", "timeout_ms": 20000},
            progress_callback=on_progress))
        await bob.wait_for("log")
        error, request = await call(b, "check_inbox")
        expect(not error and "spell it out" in request, request)
        error, ack = await call(b, "reply_to_peer", {"message": "part one, ", "partial": True})
        expect(not error and json.loads(ack)["part"] == 1, f"partial reply: {ack}")
        error, ack = await call(b, "reply_to_peer", {"message": "the end"})
        expect(not error, f"final reply: {ack}")
        result = await asking
        answer = json.loads(text_of(result))
        expect(not result.is_error and answer["body"] == "part one, the end", f"{answer}")
        expect(answer["streamed"] == 1, f"{answer}")
        expect(progress == [(1, "part one, ")], f"progress: {progress}")
        report["streamed"] = answer

        # 5. Receipts: alice asks for "read"; bob's check_inbox puts the message in front of
        # the model, and alice learns it was delivered, then read.
        error, sent = await call(a, "send_to_peer", {
            "to": "mcp-bob", "message": "did you read this?", "receipt": "read"})
        expect(not error, f"send_to_peer with receipt: {sent}")
        message_id = json.loads(sent)["message_id"]
        error, status = await call(a, "message_status", {"message_id": message_id})
        expect(not error and json.loads(status)["goals"][0]["state"] == "stored", status)
        error, read = await call(b, "check_inbox")
        expect(not error and "did you read this?" in read, read)
        for _ in range(50):  # the record follows the receipts a moment behind them
            error, status = await call(a, "message_status", {"message_id": message_id})
            if not error and json.loads(status)["goals"][0]["state"] == "read":
                break
            await asyncio.sleep(0.05)
        expect(not error and json.loads(status)["goals"][0]["state"] == "read", status)
        error, receipts = await call(a, "check_inbox")
        expect(not error and receipts.count('kind="receipt"') == 2, receipts)
        expect(receipts.index("was delivered") < receipts.index("was read"), receipts)
        report["receipts"] = receipts
        error, bad = await call(a, "send_to_peer", {
            "to": "mcp-bob", "message": "x", "receipt": "seen"})
        expect(error, f"an unknown receipt level is a tool error: {bad}")
        error, other = await call(b, "message_status", {"message_id": message_id})
        expect(error and json.loads(other)["error"]["kind"] == "not_found", other)

        # 6. Errors carry kinds.
        error, unknown = await call(a, "send_to_peer", {"to": "nobody-here", "message": "hi"})
        report["unknown_peer"] = {"is_error": error, "result": json.loads(unknown)}
        error, nothing = await call(b, "reply_to_peer", {"message": "to no one"})
        expect(error and json.loads(nothing)["error"]["kind"] == "not_found", nothing)
        error, bad = await call(a, "update_task", {
            "task_id": "00000000-0000-7000-8000-000000000000", "action": "accept"})
        expect(error and json.loads(bad)["error"]["kind"], bad)
        report["bad_task"] = json.loads(bad)
        error, wrong = await call(a, "update_task", {"task_id": "not-a-uuid", "action": "accept"})
        expect(error, f"a malformed argument is a tool error: {wrong}")

        # 7. Files: uploaded from alice's folder, passed by ref, read and saved by bob.
        expect({"upload_file", "save_attachment", "read_attachment"} <= names, str(names))
        with open(os.path.join(folders["mcp-alice"], "plan.md"), "w") as out:
            out.write("# the plan\nship it")
        outside = tempfile.mkdtemp()
        with open(os.path.join(outside, "secret"), "w") as out:
            out.write("not for the model")
        os.symlink(os.path.join(outside, "secret"), os.path.join(folders["mcp-alice"], "link"))
        for path in ("../secret", os.path.join(outside, "secret"), "link", "missing.md"):
            error, refused = await call(a, "upload_file", {"path": path})
            expect(error and json.loads(refused)["error"]["kind"] == "bad_request",
                   f"upload_file {path}: {refused}")
        error, uploaded = await call(a, "upload_file", {"path": "plan.md"})
        expect(not error, f"upload_file: {uploaded}")
        plan = json.loads(uploaded)
        expect(plan["media_type"] == "text/markdown" and plan["size"] == 18, plan)
        error, sent = await call(a, "send_to_peer", {
            "to": "mcp-bob", "message": "the plan, attached", "attachments": [plan["ref"]]})
        expect(not error, f"send_to_peer with a file: {sent}")
        error, inbox = await call(b, "check_inbox")
        expect(not error and f'<attachment ref="{plan["ref"]}" name="plan.md"' in inbox, inbox)
        error, shown = await call(b, "read_attachment", {"ref": plan["ref"]})
        expect(not error and json.loads(shown)["text"] == "# the plan\nship it", shown)
        saved = []
        for _ in range(2):
            error, result = await call(b, "save_attachment", {"ref": plan["ref"]})
            expect(not error, f"save_attachment: {result}")
            saved.append(json.loads(result)["saved"])
        expect([os.path.basename(path) for path in saved] == ["plan.md", "plan (2).md"], saved)
        for path in saved:
            expect(os.path.dirname(path) == os.path.realpath(folders["mcp-bob"])
                   or os.path.dirname(path) == folders["mcp-bob"], path)
            with open(path) as back:
                expect(back.read() == "# the plan\nship it", path)
        error, climbing = await call(b, "save_attachment", {"ref": plan["ref"],
                                                            "name": "../../evil.md"})
        expect(error and json.loads(climbing)["error"]["kind"] == "bad_request", climbing)
        expect(not os.path.exists(os.path.join(folders["mcp-bob"], "..", "..", "evil.md")),
               "nothing written outside the folder")
        # A ref bob was never handed: not found, whoever knows it.
        error, theirs = await call(a, "upload_file", {"path": "plan.md"})
        error, unseen = await call(b, "read_attachment", {"ref": json.loads(theirs)["ref"]})
        expect(error and json.loads(unseen)["error"]["kind"] == "not_found", unseen)
        report["files"] = {"plan": plan, "saved": [os.path.basename(p) for p in saved]}

    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))
