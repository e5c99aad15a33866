// A call id made now is a UUID v7 whose first 48 bits are this moment in milliseconds
// (docs/protocol.md §9, "Call ids": such a call records beside its request). No fabric needed.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { callId } from '../src/index.js';

test('call ids are UUID v7 with the time of now', () => {
  const before = Date.now();
  const ids = Array.from({ length: 1000 }, () => callId());
  const after = Date.now();
  assert.equal(new Set(ids).size, 1000);
  for (const id of ids) {
    assert.match(id, /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    const ms = parseInt(id.replace(/-/g, '').slice(0, 12), 16);
    assert.ok(before <= ms && ms <= after, `${id}: ${ms} not in [${before}, ${after}]`);
  }
});
