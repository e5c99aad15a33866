"""Agent.connect signs in as NATS users do: an NKey seed file (what `switchboard nats-config`
writes per agent), a credentials file, or a NATS CLI context by name
($XDG_CONFIG_HOME/nats/context/<name>.json). The context tests connect to
SWITCHBOARD_NATS_URL's open fabric; the signed-in test starts a fabric of its own with the
generated accounts (`switchboard nats-config`, `switchboard up --auth`) through the binary
SWITCHBOARD_BIN names, and is skipped only when that variable is unset."""

import asyncio
import json
import os
import pathlib
import queue
import socket
import subprocess
import threading
import uuid

import nats
import pytest

from switchboard import Agent, ConfigError
from switchboard.connection import context_dir, nats_options

URL = os.environ.get("SWITCHBOARD_NATS_URL", "nats://127.0.0.1:4222")
ROOT = pathlib.Path(__file__).resolve().parents[3]
SEED = "SU" + "A" * 56  # the shape of a user seed (what the options carry, not a real key)


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def run(scenario):
    asyncio.run(asyncio.wait_for(scenario(), timeout=90))


@pytest.fixture
def config(tmp_path, monkeypatch) -> pathlib.Path:
    """A fresh $XDG_CONFIG_HOME, and no $NATS_CONTEXT."""
    home = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    monkeypatch.delenv("NATS_CONTEXT", raising=False)
    return home


def write_context(context: str, **fields) -> pathlib.Path:
    path = context_dir() / f"{context}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(fields))
    return path


# ----------------------------------------------------------------------- contexts
def test_a_context_by_name_gives_the_server(config):
    path = write_context("sbtest", description="the test fabric", url=URL)
    assert path == config / "nats" / "context" / "sbtest.json"

    async def scenario():
        async with await Agent.connect(agent_id=name("ctx"), context="sbtest") as agent:
            found = await agent.lookup(agent.id)
            assert found["live_goals"] == [agent.goal_id], found
    run(scenario)


def test_nats_context_env_and_an_explicit_url_over_the_contexts(config, monkeypatch):
    # A context whose server is nowhere: the URL given wins over it.
    write_context("elsewhere", url="nats://127.0.0.1:1")
    monkeypatch.setenv("NATS_CONTEXT", "elsewhere")
    assert nats_options(None)[0] == ["nats://127.0.0.1:1"]
    write_context("sbtest", url=URL)

    async def scenario():
        async with await Agent.connect(URL, name("ctx"), context="elsewhere") as agent:
            assert agent.goal_id
        monkeypatch.setenv("NATS_CONTEXT", "sbtest")  # neither URL nor context: $NATS_CONTEXT
        async with await Agent.connect(agent_id=name("ctx")) as agent:
            assert agent.goal_id
    run(scenario)


def test_context_names_and_files_are_checked(config):
    for bad in ("../sbtest", "a/b", "..", ".hidden", "", " x", "a\\b", "/etc/passwd"):
        with pytest.raises(ConfigError, match="plain name"):
            nats_options(None, context=bad)
    with pytest.raises(ConfigError, match=r"no NATS context `nope`: .*nope\.json does not exist"):
        nats_options(None, context="nope")
    (context_dir()).mkdir(parents=True)
    (context_dir() / "broken.json").write_text("{url: nats://")
    with pytest.raises(ConfigError, match="not JSON"):
        nats_options(None, context="broken")
    write_context("numbers", url=4222)
    with pytest.raises(ConfigError, match="`url` is not a string"):
        nats_options(None, context="numbers")
    with pytest.raises(ConfigError, match="no NATS server"):
        nats_options(None)
    # A context without `url` is the default server, as for the nats CLI.
    write_context("bare")
    assert nats_options(None, context="bare") == (["nats://localhost:4222"], {})

    async def scenario():
        # Refused before any connection is made.
        with pytest.raises(ConfigError):
            await Agent.connect(agent_id=name("ctx"), context="../../etc/evil")
        with pytest.raises(TypeError):
            await Agent.connect(URL)  # no agent id
    run(scenario)


def test_sign_in_options_from_files_and_contexts(config, tmp_path, monkeypatch):
    seed_file = tmp_path / "me.nk"
    seed_file.write_text(SEED + "\n")  # as `switchboard nats-config` writes it
    creds = tmp_path / "user.creds"
    creds.write_text("-----BEGIN NATS USER JWT-----\neyJ0\n------END NATS USER JWT------\n")
    servers, options = nats_options(URL, nkey_seed=str(seed_file))
    assert servers == [URL] and options == {"nkeys_seed_str": SEED}
    assert nats_options(URL, nkey_seed=seed_file)[1] == {"nkeys_seed_str": SEED}
    assert nats_options(URL, nkey_seed=SEED)[1] == {"nkeys_seed_str": SEED}  # the seed itself
    assert nats_options([URL, URL], creds=creds) == ([URL, URL],
                                                     {"user_credentials": str(creds)})
    with pytest.raises(ConfigError, match="does not exist"):
        nats_options(URL, nkey_seed=tmp_path / "missing.nk")
    with pytest.raises(ConfigError, match="does not exist"):
        nats_options(URL, creds=tmp_path / "missing.creds")
    with pytest.raises(ConfigError, match="holds no NKey seed"):
        nats_options(URL, nkey_seed=creds)
    with pytest.raises(ConfigError, match="not both"):
        nats_options(URL, creds=creds, nkey_seed=seed_file)

    # A context's sign-in: nkey (a path, file://, env://), creds, user and password, token.
    write_context("keyed", url="nats://a:4222, nats://b:4222", nkey=str(seed_file))
    assert nats_options(None, context="keyed") == (["nats://a:4222", "nats://b:4222"],
                                                   {"nkeys_seed_str": SEED})
    write_context("uri", url=URL, nkey=f"file://{seed_file}")
    assert nats_options(None, context="uri")[1] == {"nkeys_seed_str": SEED}
    monkeypatch.setenv("SB_TEST_SEED", SEED)
    write_context("env", url=URL, nkey="env://SB_TEST_SEED")
    assert nats_options(None, context="env")[1] == {"nkeys_seed_str": SEED}
    write_context("creds", url=URL, creds=str(creds), nkey="")
    assert nats_options(None, context="creds")[1] == {"user_credentials": str(creds)}
    write_context("password", url=URL, user="alice", password="s3cret")
    assert nats_options(None, context="password")[1] == {"user": "alice", "password": "s3cret"}
    write_context("token", url=URL, token="t0ken")
    assert nats_options(None, context="token")[1] == {"token": "t0ken"}
    # A seed given here wins over the context's sign-in; its URL stays.
    assert nats_options(None, context="creds", nkey_seed=SEED) == (
        [URL], {"nkeys_seed_str": SEED})
    # What the SDK cannot do is said, not skipped.
    write_context("jwt", url=URL, user_jwt="eyJ0", nkey=str(seed_file))
    with pytest.raises(ConfigError, match="user_jwt"):
        nats_options(None, context="jwt")
    write_context("nsc", url=URL, creds="nsc://operator/account/user")
    with pytest.raises(ConfigError, match="nsc:// is not supported"):
        nats_options(None, context="nsc")
    write_context("gone", url=URL, creds=str(tmp_path / "gone.creds"))
    with pytest.raises(ConfigError, match="NATS context `gone`: creds: .* does not exist"):
        nats_options(None, context="gone")


# ----------------------------------------------------------------------- a secured fabric
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def secured(tmp_path):
    """A fabric with the generated accounts (agents isolated, each signs in with its NKey):
    `switchboard nats-config` for three agents, then `switchboard up --auth`. Yields (URL,
    the folder of the keys, the agent ids)."""
    binary = os.environ.get("SWITCHBOARD_BIN")
    if not binary:
        pytest.skip("SWITCHBOARD_BIN is not set (tests/sdk_python.rs sets it)")
    agents = [name("alice"), name("bob"), name("carol")]
    (tmp_path / "agents.toml").write_text(
        "".join(f'[[agents]]\nid = "{agent}"\n' for agent in agents))
    auth = tmp_path / "auth"
    made = subprocess.run([binary, "nats-config", "--agents", str(tmp_path / "agents.toml"),
                           "--out", str(auth)], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    bundled = ROOT / ".tools" / "nats-server" / "bin" / "nats-server"
    if not env.get("NATS_SERVER_BIN") and bundled.is_file():
        env["NATS_SERVER_BIN"] = str(bundled)
    port = free_port()
    up = subprocess.Popen(
        [binary, "up", "--auth", str(auth), "--port", str(port), "--data-dir",
         str(tmp_path / "data"), "--a2a-listen", "127.0.0.1:0", "--metrics-listen", "off"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in up.stdout], daemon=True).start()
    seen = []
    try:
        while not any("Switchboard is up." in line for line in seen):
            try:
                seen.append(lines.get(timeout=60))
            except queue.Empty:
                pytest.fail("switchboard up did not come up in 60 s:\n" + "".join(seen))
            if up.poll() is not None and lines.empty():
                pytest.fail(f"switchboard up exited ({up.returncode}):\n" + "".join(seen))
        yield f"nats://127.0.0.1:{port}", auth, agents
    finally:
        up.terminate()
        try:
            up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()


def test_agents_sign_in_with_their_nkey_seed_file_and_a_context(secured, config):
    url, auth, (alice, bob, carol) = secured
    write_context("secured", url=url, nkey=str(auth / "agents" / f"{carol}.nk"))

    async def scenario():
        # Nobody gets in without a key.
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(url, allow_reconnect=False, connect_timeout=5)
        async with await Agent.connect(url, alice, nkey_seed=auth / "agents" / f"{alice}.nk") \
                as a, \
                await Agent.connect(url, bob,
                                    nkey_seed=str(auth / "agents" / f"{bob}.nk")) as b, \
                await Agent.connect(agent_id=carol, context="secured") as c:
            result = await a.tools.execute("send_to_peer", {"to": bob, "message": "signed in"})
            assert not result.is_error, result
            assert result.value["delivered_to"] == [b.goal_id]
            shown = (await b.tools.execute("check_inbox")).content
            assert f'from="{alice}"' in shown and "signed in" in shown, shown
            report = await c.request(f"agent.send.{carol}", {"to": alice, "message": "me too"})
            assert report["delivered_to"] == [a.goal_id], report
    run(scenario)
