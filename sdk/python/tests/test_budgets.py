"""Cost budgets (docs/protocol.md §16) against a real fabric: a call carries a budget, the
callee sees it as ``msg.budget``, reports spend with ``agent.spend``, and a sub-call past what
is left is refused with :class:`BudgetExhausted`. Set SWITCHBOARD_NATS_URL (tests/sdk_python.rs
does; it starts the limits service, which keeps budgets)."""

import asyncio
import os
import uuid

import pytest

from switchboard import Agent, BudgetExhausted

URL = os.environ.get("SWITCHBOARD_NATS_URL", "nats://127.0.0.1:4222")


def test_a_callee_sees_its_budget_spends_it_and_is_refused_past_it():
    async def scenario():
        caller = await Agent.connect(URL, f"bud-{uuid.uuid4().hex[:8]}")
        callee = await Agent.connect(URL, f"bud-{uuid.uuid4().hex[:8]}")
        helper = await Agent.connect(URL, f"bud-{uuid.uuid4().hex[:8]}")
        seen = {}

        async def answer(message):
            if not message.is_call:
                return
            budget = message.budget
            seen["granted"] = budget["cost"]
            view = await callee.spend(budget, tokens=300, cost=250_000)
            seen["left"] = view.left.cost
            # A sub-call while serving draws on this budget; past what is left it is refused.
            await callee.call_parked(helper.id, "half of it", serving=message,
                                     budget={"cost": 250_000})
            try:
                await callee.call_parked(helper.id, "more", serving=message)
                seen["refused"] = None
            except BudgetExhausted as err:
                seen["refused"] = err.kind
            await message.reply("done")

        worker = asyncio.create_task(callee.serve(answer))
        try:
            got = await caller.call(callee.id, "plan it", timeout_ms=10_000,
                                    budget={"cost": 500_000})
            assert got.body == "done"
            assert seen == {"granted": 500_000, "left": 250_000, "refused": "budget_exhausted"}
            # The helper's request carries its share of the same tree.
            request = await helper.next_message(wait_ms=5000)
            assert request.budget["cost"] == 250_000
            assert request.budget["root"] == got.correlation_id
            view = await caller.budget({"root": got.correlation_id, "work": got.correlation_id})
            assert view.tree_spent.cost == 250_000
        finally:
            worker.cancel()
            for agent in (caller, callee, helper):
                await agent.close()

    asyncio.run(asyncio.wait_for(scenario(), timeout=60))


def test_a_spend_on_work_that_is_not_yours_is_refused():
    async def scenario():
        agent = await Agent.connect(URL, f"bud-{uuid.uuid4().hex[:8]}", open_goal=False)
        try:
            from switchboard import NotFound
            with pytest.raises(NotFound):
                await agent.spend({"root": str(uuid.uuid4()), "work": str(uuid.uuid4())}, cost=1)
        finally:
            await agent.close()

    asyncio.run(asyncio.wait_for(scenario(), timeout=60))
