// Provider limits (docs/protocol.md §15) against a real fabric: an agent holds a lease for a
// block with `withLimit`, reports the tokens it used, and another is refused `limited` (a
// `Busy`) while the limit is held. The operator declares the limit as Switchboard's own tools
// do, by a plain NATS request to `_SB.ops.limits.set` (the test fabric is open; under the
// generated accounts only Switchboard's own users may). Set SWITCHBOARD_NATS_URL
// (tests/sdk_typescript.rs does).
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { test } from 'node:test';

import { connect } from '@nats-io/transport-node';

import { Agent, Busy, Lease } from '../src/index.js';

const URL = process.env.SWITCHBOARD_NATS_URL ?? 'nats://127.0.0.1:4222';
const name = (prefix: string) => `${prefix}-${randomUUID().slice(0, 8)}`;

async function declare(spec: Record<string, unknown>): Promise<any> {
  const nc = await connect({ servers: URL });
  try {
    const reply = await nc.request('_SB.ops.limits.set', JSON.stringify(spec), { timeout: 10_000 });
    return reply.json();
  } finally {
    await nc.close();
  }
}

test('a lease is held for the block and given back with the tokens used', async () => {
  const key = `test:${randomUUID().slice(0, 8)}`;
  const declared = await declare({ key, concurrent: 1, tokens_per_minute: 6000 });
  assert.equal(declared.spec.key, key);
  const first = await Agent.connect(URL, name('lim'), { openGoal: false });
  const second = await Agent.connect(URL, name('lim'), { openGoal: false });
  try {
    const answer = await first.withLimit(key, { tokens: 80 }, async (lease) => {
      assert.ok(lease instanceof Lease);
      assert.equal(lease.tokens, 80);
      const view = await first.limitView(key);
      assert.equal(view.in_use, 1);
      await assert.rejects(second.acquireLimit(key, { waitMs: 0 }),
        (err: unknown) => err instanceof Busy && err.kind === 'limited');
      lease.used(10);
      return 'done';
    });
    assert.equal(answer, 'done');
    const view = await second.limitView(key);
    assert.equal(view.in_use, 0);
    assert.ok((view.tokens_available ?? 0) > 80, JSON.stringify(view));
    const again = await second.acquireLimit(key, { tokens: 80, waitMs: 1000 });
    assert.equal((await again.release()).released, true);
    assert.equal((await again.release()).released, false);
  } finally {
    await first.close();
    await second.close();
  }
});
