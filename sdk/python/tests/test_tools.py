"""The fabric as LLM tools (switchboard.tools) against a real fabric: the definitions are the
MCP server's (docs/mcp-tools.json) in the OpenAI and Anthropic formats, and tool calls recorded
from those APIs (tests/fixtures/*.json: a chat completion's `tool_calls`, a Responses output's
`function_call` items, an Anthropic message's `tool_use` blocks; agent and task ids are
placeholders like `__PEER__`, filled in here) run as an agent and answer in the call's format.
Set SWITCHBOARD_NATS_URL (tests/sdk_python.rs does)."""

import asyncio
import json
import os
import pathlib
import re
import subprocess
import sys
import uuid

import pytest

from switchboard import Agent
from switchboard.tools import (ARGUMENTS_MAX_BYTES, TOOL_NAMES, anthropic_tools, openai_tools,
                               tool_specs)

URL = os.environ.get("SWITCHBOARD_NATS_URL", "nats://127.0.0.1:4222")
TESTS = pathlib.Path(__file__).resolve().parent
FIXTURES = TESTS / "fixtures"
ROOT = TESTS.parents[2]  # the repository: the suite runs from its checkout
MCP_TOOLS = ROOT / "docs" / "mcp-tools.json"
GENERATOR = TESTS.parent / "scripts" / "generate_tools.py"


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def run(scenario):
    asyncio.run(asyncio.wait_for(scenario(), timeout=90))


def recorded(file: str, scenario: str, **ids: str) -> dict:
    """A recorded API response of fixtures/`file`, its placeholders (`__PEER__`, …) replaced
    by `ids` (peer="…" fills `__PEER__`)."""
    text = (FIXTURES / file).read_text()
    for key, value in ids.items():
        text = text.replace(f"__{key.upper()}__", value)
    response = json.loads(text)[scenario]
    left = re.findall(r"__[A-Z_]+__", json.dumps(response))
    assert not left, f"{file}/{scenario}: placeholders left: {left}"
    return response


def chat_calls(response: dict) -> list:
    """The tool calls of a recorded chat completion."""
    return response["choices"][0]["message"]["tool_calls"]


def content(result: dict):
    """A result message's content, parsed when it is JSON."""
    text = result.get("content", result.get("output"))
    try:
        return json.loads(text)
    except ValueError:
        return text


# ----------------------------------------------------------------------- the definitions
def test_the_definitions_are_the_mcp_servers_in_both_formats():
    mcp = json.loads(MCP_TOOLS.read_text())
    assert len(mcp) == 18 and tool_specs() == mcp
    assert list(TOOL_NAMES) == [tool["name"] for tool in mcp]
    chat = openai_tools()
    assert chat == [{"type": "function",
                     "function": {"name": tool["name"], "description": tool["description"],
                                  "parameters": tool["inputSchema"]}} for tool in mcp]
    responses = openai_tools(api="responses")
    assert responses == [{"type": "function", "name": tool["name"],
                          "description": tool["description"],
                          "parameters": tool["inputSchema"]} for tool in mcp]
    assert anthropic_tools() == [{"name": tool["name"], "description": tool["description"],
                                  "input_schema": tool["inputSchema"]} for tool in mcp]
    # Copies: a caller that edits its list does not change the next one.
    chat[0]["function"]["parameters"]["properties"].clear()
    assert openai_tools()[0]["function"]["parameters"] == mcp[0]["inputSchema"]


def test_the_generated_module_is_up_to_date():
    checked = subprocess.run([sys.executable, str(GENERATOR), "--check"])
    assert checked.returncode == 0, \
        "switchboard/_tool_specs.py is stale: run sdk/python/scripts/generate_tools.py"


# ----------------------------------------------------------------------- running calls
def test_list_peers_send_and_check_inbox_from_openai_tool_calls():
    async def scenario():
        me, peer = name("toolsender"), name("toolreader")
        async with await Agent.connect(URL, me) as a, \
                await Agent.connect(URL, peer, description="reads its inbox") as b:
            response = recorded("openai_chat.json", "list_and_send", peer=peer)
            assert a.tools is a.tools  # one toolbox per agent: it keeps the session's state
            listed, sent = await a.tools.run_all(chat_calls(response))
            # Each result answers its call, in the Chat Completions format.
            assert listed["role"] == "tool" and sent["role"] == "tool"
            assert listed["tool_call_id"] == "call_Yq2L7dWcP0v3nKxR8sT1bJ4m"
            assert sent["tool_call_id"] == "call_9hF3kQ2rV8mWz1LcT5pN0aXe"
            peers = {p["agent_id"]: p for p in content(listed)["peers"]}
            assert peers[peer]["description"] == "reads its inbox"
            assert peers[peer]["reachable"] is True
            report = content(sent)
            assert report["delivered_to"] == [b.goal_id], report

            check = chat_calls(recorded("openai_chat.json", "check_inbox"))[0]
            first = await b.tools.run(check)
            assert first["tool_call_id"] == "call_Kd8sN2pQ5wR7tV1xZ3bM6cF0"
            block = first["content"]
            assert block.startswith("# PEER MESSAGES\n"), block
            assert f'<peer-message from="{me}"' in block
            assert f'message_id="{report["message_id"]}"' in block
            assert "The build on main is green again; you can merge the release branch." \
                in block
            # Taken: each message is shown once.
            again = await b.tools.run(check)
            assert again["content"] == "No new messages."
    run(scenario)


def test_talk_to_agent_waits_for_the_answer_of_a_served_peer():
    async def scenario():
        me, peer = name("asker"), name("sixbyseven")
        async with await Agent.connect(URL, me) as a, await Agent.connect(URL, peer) as b:
            async def handle(message):
                if message.is_call:
                    await message.reply(f"{message.sender} asked: {message.body} 42.")
            serving = asyncio.create_task(b.serve(handle, stop_signals=()))
            try:
                response = recorded("openai_responses.json", "talk", peer=peer)
                (result,) = await a.tools.run_all(response["output"])  # reasoning skipped
                assert result["type"] == "function_call_output"
                assert result["call_id"] == "call_Pz4Qw8Er2Ty6Ui0Op3As7Df1"
                answer = content(result)
                assert answer["body"] == f"{me} asked: What is 6 times 7? 42.", answer
                assert answer["from_agent_id"] == peer
            finally:
                await b.stop()
                await serving
    run(scenario)


def test_reply_to_peer_answers_a_call_in_parts():
    async def scenario():
        caller, me = name("incident-asker"), name("oncall")
        async with await Agent.connect(URL, caller) as a, await Agent.connect(URL, me) as b:
            asking = asyncio.create_task(
                a.call(me, "What happened at 14:00?", timeout_ms=30_000))
            shown = ""
            for _ in range(100):
                shown = (await b.tools.execute("check_inbox")).content
                if 'kind="request"' in shown:
                    break
                await asyncio.sleep(0.1)
            assert f'from="{caller}"' in shown and "What happened at 14:00?" in shown, shown
            message = recorded("anthropic_messages.json", "answer_in_parts")
            pending, part, final = await b.tools.run_all(message["content"])
            assert [r["tool_use_id"] for r in (pending, part, final)] == [
                "toolu_01IxY4zA9bC2dE5fG8hJ1kL4", "toolu_01JyZ5aB0cD3eF6gH9iK2lM5",
                "toolu_01KzA6bC1dE4fG7hI0jL3mN6"]
            assert not any(r["is_error"] for r in (pending, part, final)), (pending, part, final)
            incoming = content(pending)["incoming"]
            assert [call["caller"] for call in incoming] == [caller], incoming
            answer = await asking
            assert answer["body"] == ("The incident began at 14:02 when the cache filled."
                                      " It ended at 14:19 after the failover."), answer
            assert answer["streamed"] == 1
            # Nothing is waiting any more: a reply is refused, as an error result.
            late = await b.tools.execute("reply_to_peer", {"message": "one more thing"})
            assert late.is_error and late.error["kind"] == "not_found", late
    run(scenario)


def test_a_task_from_create_to_complete_through_tool_calls():
    async def scenario():
        boss, worker = name("boss"), name("writer")
        async with await Agent.connect(URL, boss) as a, \
                await Agent.connect(URL, worker) as w:
            # The requester (an Anthropic model) gives the task.
            message = recorded("anthropic_messages.json", "create_task", peer=worker)
            (created,) = await a.tools.run_all(message["content"])  # the text block skipped
            assert created["type"] == "tool_result" and created["is_error"] is False
            assert created["tool_use_id"] == "toolu_01A09q90qw90lq917835lq9"
            task = content(created)["task"]
            assert task["assignee"] == worker and task["state"] == "submitted", task
            task_id = task["task_id"]

            # The worker (an OpenAI model) sees it, takes it and starts.
            shown = (await w.tools.execute("check_inbox", "{}")).content
            assert f'kind="task" task_id="{task_id}" task_state="submitted"' in shown, shown
            accepted, started = await w.tools.run_all(
                chat_calls(recorded("openai_chat.json", "accept_and_start", task_id=task_id)))
            assert content(accepted)["task"]["state"] == "accepted", accepted
            assert content(started)["task"]["state"] == "working", started

            # It splits part off to a copy of itself, and looks at its subtasks.
            spawned, status = await w.tools.run_all(recorded(
                "anthropic_messages.json", "spawn_and_check", task_id=task_id)["content"])
            assert not spawned["is_error"], spawned
            subtask = content(spawned)["task"]
            assert subtask["parent"] == task_id and subtask["assignee"] == worker
            assert [t["task_id"] for t in content(status)] == [subtask["task_id"]], status

            # Then it cancels the subtask and completes the task.
            canceled, completed = await w.tools.run_all(recorded(
                "anthropic_messages.json", "cancel_and_complete", task_id=task_id,
                subtask_id=subtask["task_id"])["content"])
            assert content(canceled)["task"]["state"] == "canceled", canceled
            assert content(completed)["task"]["state"] == "completed", completed

            # The requester follows up: read receipt, the record with the result, the updates.
            status, record, inbox = await a.tools.run_all(recorded(
                "anthropic_messages.json", "follow_up", task_id=task_id,
                message_id=task["message_id"])["content"])
            assert not status["is_error"], status
            states = {goal["state"] for goal in content(status)["goals"]}
            assert states == {"read"}, status
            record = content(record)
            assert record["state"] == "completed"
            assert record["result"].startswith("- 1.4: streamed answers"), record
            block = inbox["content"]
            assert f'kind="task_update" task_id="{task_id}" task_state="completed"' in block, \
                block
            assert 'kind="receipt"' in block, block
    run(scenario)


def test_bad_tool_calls_are_error_results_not_exceptions():
    async def scenario():
        me, peer = name("sloppy"), name("bystander")
        async with await Agent.connect(URL, me) as a, await Agent.connect(URL, peer) as b:
            results = await a.tools.run_all(
                chat_calls(recorded("openai_chat.json", "bad_calls", peer=peer)))
            assert len(results) == 8
            errors = [content(result)["error"] for result in results]
            assert [e["kind"] for e in errors] == ["bad_request"] * 8, errors
            unknown, truncated, missing, mistyped, array, not_id, cancel, negative = errors
            assert "send_email" in unknown["message"] and "list_peers" in unknown["message"]
            assert "not JSON" in truncated["message"]
            assert "`message`" in missing["message"]
            assert "`limit` must be an integer" in mistyped["message"]
            assert "JSON object" in array["message"]
            assert "`message_id`" in not_id["message"]
            assert "cancel_task" in cancel["message"]
            assert "`timeout_ms` must be at least 0" in negative["message"]
            # Nothing of it reached the peer.
            assert (await b.tools.execute("check_inbox")).content == "No new messages."

            # The same from an Anthropic model: is_error says so.
            results = await a.tools.run_all(
                recorded("anthropic_messages.json", "bad_calls", peer=peer)["content"])
            assert [r["is_error"] for r in results] == [True, True, True], results
            assert [content(r)["error"]["kind"] for r in results] == ["bad_request"] * 3
            assert "`to`" in content(results[0])["error"]["message"]
            assert "`partial` must be a boolean" in content(results[1])["error"]["message"]

            # Arguments past the bound are refused unread.
            huge = json.dumps({"to": peer, "message": "x" * ARGUMENTS_MAX_BYTES})
            result = await a.tools.run({"id": "call_huge", "type": "function",
                                        "function": {"name": "send_to_peer",
                                                     "arguments": huge}})
            assert content(result)["error"]["kind"] == "bad_request"
            assert "bytes" in content(result)["error"]["message"]
            # A refusal of the service is an error result of its kind.
            result = await a.tools.run({
                "type": "tool_use", "id": "toolu_x", "name": "update_task",
                "input": {"task_id": str(uuid.uuid4()), "action": "accept"}})
            assert result["is_error"] and content(result)["error"]["kind"] == "not_found", result
            # What is no tool call at all is the host's mistake: that raises.
            with pytest.raises(ValueError):
                await a.tools.run({"role": "assistant", "content": "hello"})
    run(scenario)


def test_the_readme_tools_example_runs_as_written(tmp_path):
    """README.md's "Tools for LLMs": its first block runs as written against the fabric (no
    model needed: it dispatches a recorded tool call); the blocks that call a model (they need
    an API key) must at least compile."""
    readme = (TESTS.parent / "README.md").read_text()
    section = readme.split("\n## Tools for LLMs\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 3, blocks
    for block in blocks[1:]:
        compile(block, "README.md", "exec")
    example = tmp_path / "tools_example.py"
    example.write_text(blocks[0].replace("nats://127.0.0.1:4222", URL))
    done = subprocess.run([sys.executable, str(example)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "18 18", lines
    assert lines[1] == "tool call_1", lines
    assert lines[2] == ('True {"error":{"kind":"bad_request","message":"send_to_peer needs '
                        '`to`"}}'), lines
