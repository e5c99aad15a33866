"""Provider limits (docs/protocol.md §15) against a real fabric: an agent takes a lease with
``async with agent.limit(...)``, reports the tokens it used, and is refused ``limited`` (a
``Busy``) while the limit is held. The operator declares the limit as Switchboard's own tools
do, by a plain NATS request to ``_SB.ops.limits.set`` (the test fabric is open; under the
generated accounts only Switchboard's own users may). Set SWITCHBOARD_NATS_URL
(tests/sdk_python.rs does)."""

import asyncio
import json
import os
import uuid

import nats

from switchboard import Agent, Busy, Lease

URL = os.environ.get("SWITCHBOARD_NATS_URL", "nats://127.0.0.1:4222")


def run(scenario):
    asyncio.run(asyncio.wait_for(scenario(), timeout=60))


async def declare(spec: dict) -> dict:
    nc = await nats.connect(URL)
    try:
        reply = await nc.request("_SB.ops.limits.set", json.dumps(spec).encode(), timeout=10)
        return json.loads(reply.data)
    finally:
        await nc.close()


def test_a_lease_is_held_for_the_block_and_given_back_with_the_tokens_used():
    async def scenario():
        key = f"test:{uuid.uuid4().hex[:8]}"
        declared = await declare({"key": key, "concurrent": 1, "tokens_per_minute": 6000})
        assert declared["spec"]["key"] == key
        first = await Agent.connect(URL, f"lim-{uuid.uuid4().hex[:8]}", open_goal=False)
        second = await Agent.connect(URL, f"lim-{uuid.uuid4().hex[:8]}", open_goal=False)
        try:
            async with first.limit(key, tokens=80) as lease:
                assert isinstance(lease, Lease)
                assert lease.key == key and lease.tokens == 80
                view = await first.limit_view(key)
                assert view.in_use == 1 and [l.lease_id for l in view.leases] == [lease.lease_id]
                # Held: another agent is refused at once without a wait…
                try:
                    await second.acquire_limit(key, wait_ms=0)
                    raise AssertionError("a second lease past concurrent 1")
                except Busy as err:
                    assert err.kind == "limited"
                lease.used(10)
            # …and gets it after the block, with the 70 tokens not used given back.
            view = await second.limit_view(key)
            assert view.in_use == 0
            assert view.tokens_available > 80, view
            again = await second.acquire_limit(key, tokens=80, wait_ms=1000)
            assert (await again.release()).released
            assert not (await again.release()).released  # safe to repeat
        finally:
            await first.close()
            await second.close()

    run(scenario)
