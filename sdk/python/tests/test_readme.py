"""The README's quick start runs as written: its echo agent and its caller, taken from the
README's code blocks, each in a process of its own, against the fabric (only the NATS URL is
replaced by SWITCHBOARD_NATS_URL's). The echo agent is stopped with SIGTERM, as a process
manager would: it must exit cleanly, its goal closed."""

import asyncio
import json
import os
import pathlib
import re
import subprocess
import sys
import time

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
URL = os.environ.get("SWITCHBOARD_NATS_URL", "nats://127.0.0.1:4222")


def blocks() -> dict:
    """The README's Python blocks by the heading above them."""
    text = README.read_text()
    found = {}
    for heading, code in re.findall(r"^## (.+?)\n+```python\n(.*?)```", text, re.S | re.M):
        found[heading.strip()] = code.replace("nats://127.0.0.1:4222", URL)
    return found


def test_the_quick_start_runs_as_written(tmp_path):
    code = blocks()
    assert set(code) >= {"An echo agent", "A caller"}, code.keys()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    agent_file, caller_file = tmp_path / "echo.py", tmp_path / "caller.py"
    agent_file.write_text(code["An echo agent"])
    caller_file.write_text(code["A caller"])
    echo = subprocess.Popen([sys.executable, str(agent_file)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # The caller needs the echo agent registered; it asks until it is.
        for _ in range(50):
            done = subprocess.run([sys.executable, str(caller_file)], env=env,
                                  capture_output=True, text=True, timeout=60)
            if done.returncode == 0 and "echo: hello?" in done.stdout:
                break
            time.sleep(0.2)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert "echo" in lines[0], lines  # the peers it may ask
        assert lines[1] == "echo: hello?", lines
        assert lines[2] == "3 parts: one two three", lines  # a stream ended with no final text
        assert lines[3] == "completed echo: summarise this", lines  # task.result
        assert lines[4] == "sent to 1 goal(s)", lines
    finally:
        # SIGTERM: the example's serve() stops gracefully and exits cleanly.
        echo.terminate()
        _, stderr = echo.communicate(timeout=20)
    assert echo.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr
    # ... having closed its goal and deregistered.
    found = asyncio.run(lookup("echo"))
    assert found["live_goals"] == [] and found["status"] == "offline", found


def test_every_python_block_compiles():
    """The blocks that are not run (signing in, the model loops) are at least valid Python."""
    code = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(code) >= 6, len(code)
    for block in code:
        compile(block, "README.md", "exec")


async def lookup(agent_id: str) -> dict:
    """`agent.registry.lookup` of `agent_id` (the caller need not be registered, §4.7)."""
    import nats

    nc = await nats.connect(URL)
    try:
        reply = await nc.request("agent.registry.lookup.readme-test",
                                 json.dumps({"agent_id": agent_id}).encode(), timeout=5)
        return json.loads(reply.data)
    finally:
        await nc.close()
