"""The SDK against a real fabric: nats-server and every Switchboard service. Set
SWITCHBOARD_NATS_URL (tests/sdk_python.rs starts a fabric and sets it; `switchboard up` gives
nats://127.0.0.1:4222). Each test is one scenario two or three agents play out."""

import asyncio
import os
import uuid

import pytest

from switchboard import (Agent, BadRequest, CallAnswer, CallFailed, CallPart, CallTimeout,
                         Conflict, NotFound, PeerSummary, SwitchboardError, wire)

URL = os.environ.get("SWITCHBOARD_NATS_URL", "nats://127.0.0.1:4222")


def name(prefix: str) -> str:
    """A fresh agent id, so tests never share an agent."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def run(scenario):
    asyncio.run(asyncio.wait_for(scenario(), timeout=60))


async def serve(agent: Agent, handle) -> asyncio.Task:
    """Runs `handle(message)` on every message of `agent`'s inbox, in the background."""
    async def loop():
        async for message in agent.messages(wait_ms=200):
            await handle(message)
    return asyncio.create_task(loop())


async def stop(task: asyncio.Task) -> None:
    """Cancels `task` and waits until it is gone. (Python 3.11's wait_for can swallow a
    cancel that lands as its request completes, so the cancel is repeated until it holds.)"""
    while not task.done():
        task.cancel()
        await asyncio.sleep(0.01)


def test_register_heartbeat_peers_and_leave():
    async def scenario():
        first, second = name("peer"), name("peer")
        async with await Agent.connect(URL, first, description="the first") as a:
            async with await Agent.connect(URL, second, capabilities=["search"]):
                # Typed objects (attributes) that are the reply's dicts too (issue 38).
                peers = {p.agent_id: p for p in await a.list_peers(limit=200)}
                assert second in peers and isinstance(peers[second], PeerSummary)
                assert peers[second].capabilities == ["search"] == peers[second]["capabilities"]
                assert peers[second].status == "idle" and peers[second].reachable
                found = await a.lookup(second)
                assert isinstance(found.card, wire.AgentCard)
                assert found.card.agent_id == second and found.live_goals
                assert found["card"]["agent_id"] == second
            # Gone: closed its goal and deregistered.
            found = await a.lookup(second)
            assert found.status == "offline" and not found.live_goals
    run(scenario)


def test_send_read_and_ack_at_least_once():
    async def scenario():
        sender, reader = name("sender"), name("reader")
        async with await Agent.connect(URL, sender) as s, \
                await Agent.connect(URL, reader) as r:
            for i in range(3):
                report = await s.send(reader, f"hello {i}")
                assert report.delivered_to == [r.goal_id] == report["delivered_to"]
                assert report.unreachable_reasons == [] and report.message_id
            seen = []
            async for message in r.messages(wait_ms=200):
                seen.append(message.body)
                assert message.kind == "message" and message.sender == sender
                if len(seen) == 2:
                    await message.ack()  # done with it, then leave the loop
                    break
            async for message in r.messages(wait_ms=200):
                seen.append(message.body)
                await message.ack()
                break
            assert seen == ["hello 0", "hello 1", "hello 2"]
            # A message whose handler failed is handed out again.
            await s.send(reader, "again")
            with pytest.raises(RuntimeError):
                async for message in r.messages(wait_ms=200):
                    raise RuntimeError(message.body)
            async for message in r.messages(wait_ms=200):
                assert message.body == "again"
                await message.ack()
                break
    run(scenario)


def test_a_waiting_call_a_parked_call_and_errors():
    async def scenario():
        caller, callee = name("caller"), name("callee")
        async with await Agent.connect(URL, caller) as a, \
                await Agent.connect(URL, callee) as b:
            async def answer(message):
                if message.is_call:
                    await message.reply(f"re: {message.body}")
            worker = await serve(b, answer)
            got = await a.call(callee, "ping", timeout_ms=10_000)
            assert isinstance(got, CallAnswer) and got.error is None and got.streamed == 0
            assert got.body == "re: ping" and got.from_agent_id == callee
            assert got["body"] == "re: ping"
            parked = await a.call_parked(callee, "later", timeout_ms=10_000)
            assert isinstance(parked, wire.CallParked) and parked.delivered_to
            response = None
            async for message in a.messages(wait_ms=200):
                if message.kind == "response":
                    response = message
                    break
            assert response.correlation_id == parked.correlation_id
            assert response.body == "re: later"
            await stop(worker)
            # Errors are the kind's class.
            with pytest.raises(BadRequest) as refused:
                await a.send(caller, "to myself")
            assert refused.value.kind == "self_send"
            with pytest.raises(NotFound):
                await a.call(name("ghost"), "anyone?", timeout_ms=1000)
            with pytest.raises(CallTimeout):
                await a.call(callee, "nobody reads this", timeout_ms=300)
    run(scenario)


def test_a_streamed_call_and_asking_back():
    async def scenario():
        caller, writer = name("caller"), name("writer")
        async with await Agent.connect(URL, caller) as a, \
                await Agent.connect(URL, writer) as w:
            async def write(message):
                if not message.is_call:
                    return
                if message.body == "draft":
                    for i, chunk in enumerate(["one ", "two "], start=1):
                        await message.reply_part(i, chunk)
                    await message.reply("three")
                elif message.body == "title?":
                    style = await message.ask_back("which style?")
                    await message.reply(f"a {style['body']} title")
            worker = await serve(w, write)

            async def answer_questions(message):
                if message.is_call and message.body == "which style?":
                    await message.reply("short")
            answering = await serve(a, answer_questions)
            events = [e async for e in a.call_stream(writer, "draft", timeout_ms=10_000)]
            assert [e.get("part") for e in events[:-1]] == [1, 2]
            assert all(isinstance(e, CallPart) for e in events[:-1])
            assert isinstance(events[-1], CallAnswer) and events[-1].body == "one two three"
            got = await a.call(writer, "title?", timeout_ms=10_000)
            assert got["body"] == "a short title"
            await stop(worker)
            await stop(answering)
    run(scenario)


def test_a_task_through_every_state_and_the_cancel_tree():
    async def scenario():
        boss, worker_id, helper_id = name("boss"), name("worker"), name("helper")
        async with await Agent.connect(URL, boss) as b, \
                await Agent.connect(URL, worker_id) as w, \
                await Agent.connect(URL, helper_id) as h:
            spawned = asyncio.Event()
            children = []

            async def work(message):
                if message.kind == "task":
                    task = await message.task().accept()
                    await task.start()
                    if message.body == "big job":
                        children.append(await task.spawn(helper_id, "part of it"))
                        spawned.set()
                        return
                    await task.progress("half way", parts=[{"type": "text", "text": "50%"}])
                    await task.input_required("which format?")
                elif message.kind == "message" and message.task_id:
                    # The requester's answer to the question: resume, finish.
                    await w.task_op("start", message.task_id)
                    await w.task_op("complete", message.task_id, f"done as {message.body}")
            working = await serve(w, work)
            task = await b.create_task(worker_id, "small job", deadline_in_ms=30_000)
            updates = []
            async for message in b.messages(wait_ms=200):
                if message.kind == "task_update" and message.task_id == task.id:
                    updates.append(message.task_state)
                    if message.task_state == "input_required":
                        await (await task.refresh()).answer("pdf")
                    if message.task_state == "completed":
                        break
            assert updates[-1] == "completed" and "working" in updates
            done = await task.refresh()
            assert done.record["result"] == "done as pdf" == done.record.result == done.result
            last = done.record.history[-1]
            assert isinstance(last, wire.TaskTransition)
            assert (last.from_, last.op, last.to) == ("working", "complete", "completed")
            listed = await b.list_tasks(role="requester")
            assert task.id in [t.task_id for t in listed.tasks]

            # A tree: canceling the parent cancels the open subtask.
            big = await b.create_task(worker_id, "big job")
            await asyncio.wait_for(spawned.wait(), 10)
            await big.cancel("plans changed")
            child = await children[0].refresh()
            assert child.state == "canceled"
            # The canceled task can no longer change (a repeated cancel is a duplicate).
            with pytest.raises(Conflict) as ended:
                await w.task_op("complete", big.id, "too late")
            assert ended.value.kind == "task_terminal"
            await stop(working)
    run(scenario)


def test_receipts_report_delivered_and_read():
    async def scenario():
        sender, reader = name("sender"), name("reader")
        async with await Agent.connect(URL, sender) as s, \
                await Agent.connect(URL, reader) as r:
            report = await s.send(reader, "did you read this?", receipt="read")
            async for message in r.messages(wait_ms=200):
                assert message.body == "did you read this?"
                await message.ack()  # read: the receipt says so
                break
            states = []
            for _ in range(50):
                status = await s.send_status(report["message_id"])
                states = [goal["state"] for goal in status["goals"]]
                if states == ["read"]:
                    break
                await asyncio.sleep(0.1)
            assert states == ["read"]
    run(scenario)


def test_every_error_is_a_switchboard_error_with_its_kind():
    async def scenario():
        async with await Agent.connect(URL, name("lonely")) as a:
            with pytest.raises(SwitchboardError) as missing:
                await a.get_task(str(uuid.uuid4()))
            assert missing.value.kind == "not_found" and missing.value.code == 404
            assert isinstance(missing.value, NotFound)
    run(scenario)


def test_requests_carry_the_current_spans_trace_context():
    import nats
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("sdk-test")

    async def scenario():
        caller, callee = name("traced"), name("callee")
        watcher = await nats.connect(URL)
        # A plain subscriber sees a copy of every call request (the correlator's is a queue).
        seen = await watcher.subscribe(f"agent.call.{caller}")
        async with await Agent.connect(URL, caller) as a, \
                await Agent.connect(URL, callee) as b:
            async def answer(message):
                if message.is_call:
                    await message.reply("ok")
            worker = await serve(b, answer)
            with tracer.start_as_current_span("ask") as span:
                await a.call(callee, "traced?", timeout_ms=10_000)
                trace_id = format(span.get_span_context().trace_id, "032x")
            await stop(worker)
            request = await seen.next_msg(timeout=5)
            assert trace_id in (request.headers or {}).get("traceparent", ""), request.headers
        await watcher.close()
    run(scenario)


def test_a_broadcast_reaches_every_peer_and_tasks_can_be_rejected_or_failed():
    async def scenario():
        a_id, b_id = name("bcast"), name("bcast")
        card = {"allow_from": ["bcast-*"], "can_talk_to": ["bcast-*"]}
        async with await Agent.connect(URL, a_id, card=card) as a, \
                await Agent.connect(URL, b_id, card=card) as b:
            report = await a.broadcast("all hands")
            assert report["delivered_to"] == [b.goal_id]
            got = await b.next_message()
            assert got.body == "all hands"

            rejected = await a.create_task(b_id, "no thanks")
            offered = await b.next_message()
            assert (await offered.task().reject("busy")).state == "rejected"
            assert (await rejected.refresh()).state == "rejected"
            failed = await a.create_task(b_id, "try it")
            given = await b.next_message()
            task = await given.task().accept()
            await task.start()
            assert (await task.fail("it broke")).state == "failed"
            assert (await failed.refresh()).record.reason == "it broke"
    run(scenario)


# --------------------------------------------------------------------------- issue 38
async def serving(agent: Agent, handle, **options) -> asyncio.Task:
    """`agent.serve(handle)` in the background, without signal handlers (pytest's own)."""
    task = asyncio.create_task(agent.serve(handle, stop_signals=(), wait_ms=200, **options))
    await asyncio.sleep(0)
    return task


async def unread(agent: Agent) -> dict:
    """The agent's goal as a peek sees it (nothing recorded): ``cursor`` and ``unread``."""
    return await agent.request(f"agent.inbox.fetch.{agent.id}",
                               {"goal_id": agent.goal_id, "peek": True})


async def eventually(check, seconds: float = 5.0):
    """Waits until ``await check()`` is truthy; its last value."""
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        value = await check()
        if value or asyncio.get_running_loop().time() > deadline:
            return value
        await asyncio.sleep(0.05)


async def until(predicate, seconds: float = 5.0) -> None:
    """Waits until ``predicate()`` holds, failing after ``seconds``."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out waiting"
        await asyncio.sleep(0.02)


def test_a_raising_handler_answers_its_caller_at_once_rejects_a_message_and_serves_on():
    import nats

    async def scenario():
        caller, callee = name("caller"), name("fragile")
        handled = []
        async with await Agent.connect(URL, caller) as a, \
                await Agent.connect(URL, callee) as b:
            async def handle(message):
                if message.body.startswith("boom"):
                    raise ValueError(f"cannot do {message.body!r}")
                if message.body == "half":
                    await message.reply_part(1, "half an answer")
                    raise RuntimeError("broke after one part")
                if message.is_call:
                    await message.reply(f"ok: {message.body}")
                handled.append(message.body)
            worker = await serving(b, handle)

            # A call whose handler raises: the caller hears it at once, with the reason.
            started = asyncio.get_running_loop().time()
            with pytest.raises(CallFailed) as failed:
                await a.call(callee, "boom", timeout_ms=10_000)
            assert asyncio.get_running_loop().time() - started < 1.0
            assert failed.value.kind == "handler_error"
            assert failed.value.message == "cannot do 'boom'"
            assert failed.value.callee == callee and isinstance(failed.value, SwitchboardError)
            # ... and the next one is served.
            assert (await a.call(callee, "ping", timeout_ms=10_000))["body"] == "ok: ping"

            # A parked call's answer that is an error says so, and raises on request.
            parked = await a.call_parked(callee, "boom, parked", timeout_ms=10_000)
            response = None
            async for message in a.messages(wait_ms=200):
                if message.kind == "response" \
                        and message.correlation_id == parked["correlation_id"]:
                    response = message
                    await message.ack()
                    break
            assert response.error == {"kind": "handler_error",
                                      "message": "cannot do 'boom, parked'"}
            with pytest.raises(CallFailed) as parked_failed:
                response.raise_for_error()
            assert parked_failed.value.callee == callee

            # A stream whose handler raises after a part: the part, then CallFailed.
            events = []
            with pytest.raises(CallFailed) as broken:
                async for event in a.call_stream(callee, "half", timeout_ms=10_000):
                    events.append(event)
            assert [e["body"] for e in events] == ["half an answer"]
            assert broken.value.kind == "handler_error"
            assert "broke after one part" in broken.value.message

            # A plain message whose handler raises is rejected into the dead letters, with
            # the reason; the message after it is handled.
            await a.send(callee, "boom (a plain message)")
            await a.send(callee, "after it")
            await until(lambda: "after it" in handled)
            assert await eventually(lambda: _nothing_unread(b)), await unread(b)
            watcher = await nats.connect(URL)
            try:
                letter = await watcher.jetstream().get_last_msg(
                    "AGENT_DLQ", f"agent.dlq.AGENT_INBOX.inbox-{b.goal_id}")
                assert b"boom (a plain message)" in letter.data
                reason = letter.headers["Switchboard-Dlq-Reason"]
                assert reason.startswith("rejected by its reader: cannot do"), reason
            finally:
                await watcher.close()
            assert not worker.done()  # still serving
            await b.stop()
            await worker
    run(scenario)


def test_a_handler_that_raises_on_a_task_ends_it_for_the_requester_and_serves_on():
    import nats

    async def scenario():
        requester, worker_id = name("requester"), name("flaky")
        handled = []
        async with await Agent.connect(URL, requester) as a, \
                await Agent.connect(URL, worker_id) as w:
            async def handle(message):
                if message.kind == "task":
                    if message.body != "refuse":
                        task = await message.task().accept()
                        if message.body == "start, then raise":
                            await task.start()
                    raise RuntimeError(f"cannot do {message.body!r}")
                handled.append(message.body)
            worker = await serving(w, handle)

            async def ended(task):
                """The task's end as its requester sees it, within two seconds."""
                started = asyncio.get_running_loop().time()
                while (await task.refresh()).state not in ("completed", "failed", "rejected",
                                                           "canceled"):
                    assert asyncio.get_running_loop().time() - started < 2.0, task.state
                    await asyncio.sleep(0.05)
                return task.state, task.reason

            # Raised before accepting: the task is rejected, with the exception's text.
            refused = await a.create_task(worker_id, "refuse", deadline_in_ms=60_000)
            assert await ended(refused) == ("rejected", "cannot do 'refuse'")
            # Raised after accepting (and after starting): it fails, with the text.
            accepted = await a.create_task(worker_id, "accept, then raise")
            assert await ended(accepted) == ("failed", "cannot do 'accept, then raise'")
            started = await a.create_task(worker_id, "start, then raise")
            assert await ended(started) == ("failed", "cannot do 'start, then raise'")
            ops = [step.op for step in started.record.history]
            assert ops == ["accept", "start", "fail"], ops

            # The worker serves on; its task messages were acknowledged, not dead letters.
            await a.send(worker_id, "after them")
            await until(lambda: "after them" in handled)
            assert await eventually(lambda: _nothing_unread(w)), await unread(w)
            watcher = await nats.connect(URL)
            try:
                with pytest.raises(nats.js.errors.NotFoundError):
                    await watcher.jetstream().get_last_msg(
                        "AGENT_DLQ", f"agent.dlq.AGENT_INBOX.inbox-{w.goal_id}")
            finally:
                await watcher.close()
            assert not worker.done()  # still serving
            await w.stop()
            await worker
    run(scenario)


async def _nothing_unread(agent: Agent) -> bool:
    return (await unread(agent))["unread"] == 0


def test_a_restarted_agent_reads_what_was_sent_while_it_was_down_from_one_goal():
    async def scenario():
        sender, worker = name("sender"), name("restarts")
        async with await Agent.connect(URL, sender) as s:
            # The first run crashes in its handler: leaving `async with` by an exception only
            # disconnects, the goal and its messages stay.
            with pytest.raises(RuntimeError):
                async with await Agent.connect(URL, worker) as first:
                    goal = first.goal_id
                    assert first.goal_name == "main"
                    await s.send(worker, "before the crash")
                    async for message in first.messages(wait_ms=200):
                        raise RuntimeError(f"crashed on {message.body}")
            assert first.is_closed
            # Sent while it is down: it goes to the same goal.
            report = await s.send(worker, "while it was down")
            assert report["delivered_to"] == [goal]

            async with await Agent.connect(URL, worker) as second:
                assert second.goal_id == goal  # the same name is the same goal
                found = await s.lookup(worker)
                assert found["live_goals"] == [goal]
                seen = []
                async for message in second.messages(wait_ms=200):
                    seen.append(message.body)
                    if len(seen) == 2:
                        await message.ack()
                        break
                assert seen == ["before the crash", "while it was down"]
                # Another name is another goal (a second worker of the same agent).
                async with await Agent.connect(URL, worker, goal="worker-2") as third:
                    assert third.goal_id != goal
                    assert set((await s.lookup(worker))["live_goals"]) == {goal, third.goal_id}
                    await third.close(deregister=False)
                assert (await s.lookup(worker))["live_goals"] == [goal]
            # A clean exit closes it and deregisters.
            found = await s.lookup(worker)
            assert found["live_goals"] == [] and found["status"] == "offline"
    run(scenario)


def test_a_crash_under_serve_keeps_the_goal_and_the_restart_serves_what_waited():
    async def scenario():
        sender, worker = name("sender"), name("restarts")
        async with await Agent.connect(URL, sender) as s:
            release = asyncio.Event()

            async def stuck(message):
                await release.wait()  # never finishes: the crash comes first

            with pytest.raises(asyncio.TimeoutError):
                async with await Agent.connect(URL, worker) as first:
                    goal = first.goal_id
                    await s.send(worker, "in progress at the crash")
                    await asyncio.wait_for(first.serve(stuck, stop_signals=(), wait_ms=200), 1.0)
            await s.send(worker, "while it was down")
            got = []
            async with await Agent.connect(URL, worker) as second:
                assert second.goal_id == goal
                assert (await s.lookup(worker))["live_goals"] == [goal]

                async def handle(message):
                    got.append(message.body)
                task = await serving(second, handle)
                await until(lambda: len(got) == 2)
                await second.stop()
                await task
            assert got == ["in progress at the crash", "while it was down"]
    run(scenario)


def test_serve_runs_up_to_max_concurrent_handlers_and_acks_in_order():
    async def scenario():
        sender, worker = name("sender"), name("parallel")
        async with await Agent.connect(URL, sender) as s, \
                await Agent.connect(URL, worker) as w:
            running, peak, done = 0, 0, []
            four_in, release = asyncio.Event(), asyncio.Event()

            async def handle(message):
                nonlocal running, peak
                running += 1
                peak = max(peak, running)
                try:
                    if message.body.startswith("together"):
                        if running == 4:
                            four_in.set()
                        await four_in.wait()
                        await asyncio.sleep(0.05)
                    elif message.body == "slow":
                        await release.wait()
                finally:
                    running -= 1
                done.append(message.body)
            task = await serving(w, handle, max_concurrent=4)

            # Five at once: four run together, the fifth waits for a slot.
            for i in range(5):
                await s.send(worker, f"together {i}")
            await asyncio.wait_for(four_in.wait(), 5)
            await until(lambda: len(done) == 5)
            assert peak == 4, peak
            assert await eventually(lambda: _nothing_unread(w)), await unread(w)

            # A slow first message holds the cursor back while those after it finish.
            await s.send(worker, "slow")
            for i in range(5):
                await s.send(worker, f"fast {i}")
            await until(lambda: len(done) == 10)
            assert "slow" not in done and len(done) == 10
            await asyncio.sleep(0.3)  # room for a wrong ack to be written
            peek = await unread(w)
            assert peek["unread"] == 6, peek  # nothing acknowledged past the slow one
            assert peek["messages"][0]["message"]["body"] == "slow"
            release.set()
            await until(lambda: len(done) == 11)
            assert await eventually(lambda: _nothing_unread(w)), await unread(w)
            await w.stop()
            await task
    run(scenario)


def test_served_acks_ride_on_the_next_fetch_and_the_last_goes_on_its_own():
    """Issue 40: under serve, a handled message's ack rides on the loop's next fetch
    (``ack_through``) instead of a request of its own; the last one, with no fetch to carry
    it, goes on its own after ``ACK_LINGER``. Every message ends acknowledged."""
    import nats

    from switchboard.serving import ACK_LINGER

    async def scenario():
        caller, worker = name("caller"), name("acker")
        async with await Agent.connect(URL, caller) as a, \
                await Agent.connect(URL, worker) as w:
            tap = await nats.connect(URL)
            alone = []

            async def count(message):
                alone.append(message)
            await tap.subscribe(f"agent.inbox.ack.{worker}", cb=count)
            await tap.flush()

            async def answer(message):
                await message.reply(message.body)
            task = await serving(w, answer)
            calls = 40
            for i in range(calls):
                got = await a.call(worker, f"q{i}", timeout_ms=10_000)
                assert got.body == f"q{i}"
            assert await eventually(lambda: _nothing_unread(w), ACK_LINGER * 40), \
                await unread(w)
            await asyncio.sleep(0.1)
            assert 1 <= len(alone) < calls // 4, f"{len(alone)} of {calls} acks went alone"
            await tap.close()
            await w.stop()
            await task
    run(scenario)


def test_a_stream_ends_with_no_final_text_and_reply_error_fails_the_call():
    async def scenario():
        caller, writer = name("caller"), name("streamer")
        async with await Agent.connect(URL, caller) as a, \
                await Agent.connect(URL, writer) as w:
            async def handle(message):
                if not message.is_call:
                    return
                if message.body == "stream":
                    await message.reply_part(1, "one")
                    await message.reply_part(2, " two")
                    await message.end_stream()
                elif message.body == "stream, then nothing":
                    await message.reply_part(1, "only part")
                    await message.reply("")
                else:
                    await message.reply_error("not_supported", f"no idea what {message.body} is")
            task = await serving(w, handle, max_concurrent=2)
            events = [e async for e in a.call_stream(writer, "stream", timeout_ms=10_000)]
            assert [(e.get("part"), e["body"]) for e in events[:-1]] == [(1, "one"), (2, " two")]
            assert events[-1]["body"] == "one two" and events[-1].get("streamed") == 2
            assert "partial" not in events[-1]
            assert [(e.part, e.body) for e in events[:-1] if isinstance(e, CallPart)] == [
                (1, "one"), (2, " two")]
            answer = await a.call(writer, "stream, then nothing", timeout_ms=10_000)
            assert answer.body == "only part" and answer.streamed == 1
            with pytest.raises(CallFailed) as failed:
                await a.call(writer, "frobnicate", timeout_ms=10_000)
            assert failed.value.kind == "not_supported"
            assert failed.value.message == "no idea what frobnicate is"
            assert failed.value.answer["correlation_id"] == failed.value.correlation_id
            await w.stop()
            await task
    run(scenario)


def test_stop_finishes_the_handler_in_progress_then_closes_the_goal():
    async def scenario():
        caller, worker = name("caller"), name("stopping")
        async with await Agent.connect(URL, caller) as a:
            w = await Agent.connect(URL, worker)
            started, finished = asyncio.Event(), []

            async def handle(message):
                started.set()
                await asyncio.sleep(0.5)
                finished.append(message.body)
                await message.reply("finished")
            task = await serving(w, handle)
            call = asyncio.create_task(a.call(worker, "take your time", timeout_ms=10_000))
            await asyncio.wait_for(started.wait(), 5)
            await w.stop()  # waits for the handler in progress
            assert finished == ["take your time"] and w.is_closed
            await task
            assert (await call)["body"] == "finished"
            found = await a.lookup(worker)
            assert found["live_goals"] == [] and found["status"] == "offline"
    run(scenario)
