// Cost budgets (docs/protocol.md §16) against a real fabric: a call carries a budget, the
// callee sees it as `msg.budget`, reports spend with `agent.spend`, and a sub-call past what is
// left is refused with `BudgetExhausted`. Set SWITCHBOARD_NATS_URL (tests/sdk_typescript.rs
// does; it starts the limits service, which keeps budgets).
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { test } from 'node:test';

import { Agent, BudgetExhausted, NotFound } from '../src/index.js';

const URL = process.env.SWITCHBOARD_NATS_URL ?? 'nats://127.0.0.1:4222';
const name = (prefix: string) => `${prefix}-${randomUUID().slice(0, 8)}`;

test('a callee sees its budget, spends it, and is refused past it', async () => {
  const caller = await Agent.connect(URL, name('bud'));
  const callee = await Agent.connect(URL, name('bud'));
  const helper = await Agent.connect(URL, name('bud'));
  const seen: Record<string, unknown> = {};
  const served = callee.serve(async (m) => {
    if (!m.isCall || !m.budget) return;
    seen.granted = m.budget.cost;
    seen.left = (await callee.spend(m.budget, { tokens: 300, cost: 250_000 })).left.cost;
    await callee.callParked(helper.id, 'half of it', { serving: m, budget: { cost: 250_000 } });
    await assert.rejects(callee.callParked(helper.id, 'more', { serving: m }),
      (err: unknown) => err instanceof BudgetExhausted && err.kind === 'budget_exhausted');
    seen.refused = true;
    await m.reply('done');
  }, { stopSignals: [] });
  try {
    const got = await caller.call(callee.id, 'plan it', { timeoutMs: 10_000, budget: { cost: 500_000 } });
    assert.equal(got.body, 'done');
    assert.deepEqual(seen, { granted: 500_000, left: 250_000, refused: true });
    const request = await helper.nextMessage({ waitMs: 5000 });
    assert.equal(request?.budget?.cost, 250_000);
    assert.equal(request?.budget?.root, got.correlation_id);
    const view = await caller.budget({ root: got.correlation_id, work: got.correlation_id });
    assert.equal(view.tree_spent.cost, 250_000);
    await assert.rejects(caller.spend({ root: randomUUID(), work: randomUUID() }, { cost: 1 }),
      (err: unknown) => err instanceof NotFound);
  } finally {
    await callee.close();
    await served;
    await caller.close();
    await helper.close();
  }
});
