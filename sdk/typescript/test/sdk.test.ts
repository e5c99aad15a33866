// The SDK against a real fabric (nats-server and every Switchboard service): set
// SWITCHBOARD_NATS_URL (tests/sdk_typescript.rs starts a fabric and sets it). Each test is one
// scenario two or three agents play out.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { test } from 'node:test';

import { Agent, BadRequest, CallTimeout, Conflict, Message, NotFound } from '../src/index.js';

const URL = process.env.SWITCHBOARD_NATS_URL ?? 'nats://127.0.0.1:4222';
const name = (prefix: string) => `${prefix}-${randomUUID().slice(0, 8)}`;

/** Runs `handle` on every message of `agent`'s inbox until `stop` is called. */
function serve(agent: Agent, handle: (m: Message) => Promise<void>): () => void {
  let stopped = false;
  (async () => {
    for await (const message of agent.messages({ waitMs: 200 })) {
      if (stopped) break;
      await handle(message);
    }
  })().catch(() => undefined);
  return () => { stopped = true; };
}

async function firstMessage(agent: Agent, wanted: (m: Message) => boolean): Promise<Message> {
  for await (const message of agent.messages({ waitMs: 200 })) {
    if (wanted(message)) {
      await message.ack();
      return message;
    }
  }
  throw new Error('the agent closed');
}

test('register, see peers, leave', async () => {
  const a = await Agent.connect(URL, name('peer'), { description: 'the first' });
  const bId = name('peer');
  const b = await Agent.connect(URL, bId, { capabilities: ['search'] });
  try {
    const peers = await a.listPeers({ limit: 200 });
    const found = peers.find((p) => p.agent_id === bId);
    assert.deepEqual(found?.capabilities, ['search']);
    await b.close();
    assert.equal((await a.lookup(bId)).status, 'offline');
  } finally {
    await b.close();
    await a.close();
  }
});

test('send, read and ack at least once', async () => {
  const readerId = name('reader');
  const s = await Agent.connect(URL, name('sender'));
  const r = await Agent.connect(URL, readerId);
  try {
    const report = await s.send(readerId, 'hello', { parts: [{ type: 'data', data: { n: 1 } }] });
    assert.deepEqual(report.delivered_to, [r.goalId]);
    const got = await firstMessage(r, () => true);
    assert.equal(got.body, 'hello');
    assert.deepEqual(got.parts, [{ type: 'data', data: { n: 1 } }]);
  } finally {
    await s.close();
    await r.close();
  }
});

test('a waiting call, a parked call and errors', async () => {
  const callerId = name('caller');
  const calleeId = name('callee');
  const a = await Agent.connect(URL, callerId);
  const b = await Agent.connect(URL, calleeId);
  const stop = serve(b, async (m) => {
    if (m.isCall) await m.reply(`re: ${m.body}`);
  });
  try {
    const got = await a.call(calleeId, 'ping', { timeoutMs: 10_000 });
    assert.equal(got.body, 're: ping');
    const parked = await a.callParked(calleeId, 'later', { timeoutMs: 10_000 });
    const response = await firstMessage(a, (m) => m.kind === 'response');
    assert.equal(response.correlationId, parked.correlation_id);
    assert.equal(response.body, 're: later');
    await assert.rejects(a.send(callerId, 'to myself'),
      (err: unknown) => err instanceof BadRequest && err.kind === 'self_send');
    await assert.rejects(a.call(name('ghost'), 'anyone?', { timeoutMs: 1000 }), NotFound);
    const sleeper = await Agent.connect(URL, name('sleeper'));
    await assert.rejects(a.call(sleeper.id, 'nobody reads this', { timeoutMs: 300 }), CallTimeout);
    await sleeper.close();
  } finally {
    stop();
    await a.close();
    await b.close();
  }
});

test('a streamed call and a question back', async () => {
  const writerId = name('writer');
  const a = await Agent.connect(URL, name('caller'));
  const w = await Agent.connect(URL, writerId);
  const stopWriter = serve(w, async (m) => {
    if (!m.isCall) return;
    if (m.body === 'draft') {
      await m.replyPart(1, 'one ');
      await m.replyPart(2, 'two ');
      await m.reply('three');
    } else if (m.body === 'title?') {
      const style = await m.askBack('which style?');
      await m.reply(`a ${style.body} title`);
    }
  });
  const stopCaller = serve(a, async (m) => {
    if (m.isCall && m.body === 'which style?') await m.reply('short');
  });
  try {
    const events = [];
    for await (const event of a.callStream(writerId, 'draft', { timeoutMs: 10_000 })) {
      events.push(event);
    }
    assert.deepEqual(events.slice(0, -1).map((e) => ('part' in e ? e.part : 0)), [1, 2]);
    assert.equal(events.at(-1)?.body, 'one two three');
    const got = await a.call(writerId, 'title?', { timeoutMs: 10_000 });
    assert.equal(got.body, 'a short title');
  } finally {
    stopWriter();
    stopCaller();
    await a.close();
    await w.close();
  }
});

test('a task with a question, and the cancel tree', async () => {
  const workerId = name('worker');
  const helperId = name('helper');
  const b = await Agent.connect(URL, name('boss'));
  const w = await Agent.connect(URL, workerId);
  const h = await Agent.connect(URL, helperId);
  const children: string[] = [];
  const stop = serve(w, async (m) => {
    if (m.kind === 'task') {
      const task = await m.task().accept();
      await task.start();
      if (m.body === 'big job') {
        children.push((await task.spawn(helperId, 'part of it')).id);
        return;
      }
      await task.progress('half way');
      await task.inputRequired('which format?');
    } else if (m.kind === 'message' && m.taskId) {
      await w.taskOp('start', m.taskId);
      await w.taskOp('complete', m.taskId, `done as ${m.body}`);
    }
  });
  try {
    const task = await b.createTask(workerId, 'small job', { deadlineInMs: 30_000 });
    for await (const m of b.messages({ waitMs: 200 })) {
      if (m.kind !== 'task_update' || m.taskId !== task.id) continue;
      if (m.taskState === 'input_required') {
        await (await task.refresh()).answer('pdf');
      }
      if (m.taskState === 'completed') {
        await m.ack();
        break;
      }
    }
    assert.equal((await task.refresh()).record.result, 'done as pdf');
    const big = await b.createTask(workerId, 'big job');
    for (let i = 0; i < 100 && children.length === 0; i++) await new Promise((r) => setTimeout(r, 50));
    await big.cancel('plans changed');
    assert.equal((await h.getTask(children[0])).state, 'canceled');
    await assert.rejects(w.taskOp('complete', big.id, 'too late'),
      (err: unknown) => err instanceof Conflict && err.kind === 'task_terminal');
  } finally {
    stop();
    await b.close();
    await w.close();
    await h.close();
  }
});

test('receipts say read', async () => {
  const readerId = name('reader');
  const s = await Agent.connect(URL, name('sender'));
  const r = await Agent.connect(URL, readerId);
  try {
    const report = await s.send(readerId, 'did you read this?', { receipt: 'read' });
    await firstMessage(r, () => true);
    let states: string[] = [];
    for (let i = 0; i < 50; i++) {
      states = (await s.sendStatus(report.message_id!)).goals.map((g) => g.state);
      if (states.join() === 'read') break;
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.deepEqual(states, ['read']);
  } finally {
    await s.close();
    await r.close();
  }
});

test('a broadcast reaches every peer; a task can be rejected or failed', async () => {
  const aId = name('bcast');
  const bId = name('bcast');
  const a = await Agent.connect(URL, aId, { card: { allow_from: [`bcast-*`], can_talk_to: ['bcast-*'] } });
  const b = await Agent.connect(URL, bId, { card: { allow_from: [`bcast-*`], can_talk_to: ['bcast-*'] } });
  try {
    const report = await a.broadcast('all hands');
    assert.deepEqual(report.delivered_to, [b.goalId]);
    const got = await firstMessage(b, () => true);
    assert.equal(got.body, 'all hands');

    const rejected = await a.createTask(bId, 'no thanks');
    const offered = await firstMessage(b, (m) => m.kind === 'task');
    assert.equal((await offered.task().reject('busy')).state, 'rejected');
    assert.equal((await rejected.refresh()).state, 'rejected');
    const failed = await a.createTask(bId, 'try it');
    const given = await firstMessage(b, (m) => m.kind === 'task');
    const task = await given.task().accept();
    await task.start();
    assert.equal((await task.fail('it broke')).state, 'failed');
    assert.equal((await failed.refresh()).record.reason, 'it broke');
  } finally {
    await a.close();
    await b.close();
  }
});
