// The SDK against a real fabric (nats-server and every Switchboard service): set
// SWITCHBOARD_NATS_URL (tests/sdk_typescript.rs starts a fabric and sets it). Each test is one
// scenario two or three agents play out.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { ACK_LINGER_MS, Agent, BadRequest, CallFailed, CallTimeout, Conflict, Message, NotFound }
  from '../src/index.js';

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

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Waits until `check` holds (or fails after `ms`). */
async function until(check: () => boolean, ms = 10_000): Promise<void> {
  for (const end = Date.now() + ms; !check(); await sleep(20)) {
    if (Date.now() > end) throw new Error('timed out waiting');
  }
}

/** The reason the dead letters give for `goalId`'s last rejected message (read as the
 * operator would, with the JetStream API of the open test fabric). */
async function lastDeadLetterReason(agent: Agent, goalId: string): Promise<string | undefined> {
  const reply = await agent.nc.request('$JS.API.STREAM.MSG.GET.AGENT_DLQ',
    JSON.stringify({ last_by_subj: `agent.dlq.AGENT_INBOX.inbox-${goalId}` }), { timeout: 5000 });
  const got = reply.json<{ message?: { hdrs?: string } }>();
  const headers = Buffer.from(got.message?.hdrs ?? '', 'base64').toString('utf8');
  return /^Switchboard-Dlq-Reason: (.*)$/m.exec(headers)?.[1]?.trim();
}

test('a handler that throws on a call: the caller gets CallFailed at once, the loop goes on',
  async () => {
    const calleeId = name('fragile');
    const a = await Agent.connect(URL, name('caller'));
    const b = await Agent.connect(URL, calleeId);
    const thrown: unknown[] = [];
    const served = b.serve(async (m) => {
      if (m.body === 'boom') throw new Error('kaboom');
      if (m.body === 'stream then boom') {
        await m.replyPart(1, 'so far ');
        throw new Error('half way');
      }
      if (m.isCall) await m.reply(`ok: ${m.body}`);
    }, { stopSignals: [], onError: (err) => thrown.push(err) });
    try {
      assert.equal((await a.call(calleeId, 'warm up', { timeoutMs: 10_000 })).body, 'ok: warm up');
      const started = Date.now();
      await assert.rejects(a.call(calleeId, 'boom', { timeoutMs: 10_000 }), (err: unknown) =>
        err instanceof CallFailed && err.kind === 'handler_error' && err.detail === 'kaboom'
        && err.callee === calleeId && err.code === 502);
      assert.ok(Date.now() - started < 1000, `CallFailed after ${Date.now() - started} ms`);
      // The loop serves the next call.
      assert.equal((await a.call(calleeId, 'next', { timeoutMs: 10_000 })).body, 'ok: next');
      // A stream whose handler throws: the parts so far, then CallFailed.
      const parts: string[] = [];
      await assert.rejects((async () => {
        for await (const event of a.callStream(calleeId, 'stream then boom', { timeoutMs: 10_000 })) {
          if ('partial' in event) parts.push(event.body);
        }
      })(), (err: unknown) => err instanceof CallFailed && err.detail === 'half way');
      assert.deepEqual(parts, ['so far ']);
      // A parked call's error answer arrives as a response carrying the error.
      const parked = await a.callParked(calleeId, 'boom', { timeoutMs: 10_000 });
      const response = await firstMessage(a, (m) => m.correlationId === parked.correlation_id);
      assert.deepEqual(response.error, { kind: 'handler_error', message: 'kaboom' });
      assert.throws(() => response.raiseForError(),
        (err: unknown) => err instanceof CallFailed && err.kind === 'handler_error');
      assert.equal(thrown.length, 3);
    } finally {
      await b.close();
      await served;
      await a.close();
    }
  });

test('a handler that throws on a message: it is rejected with the reason, the loop goes on',
  async () => {
    const readerId = name('reader');
    const s = await Agent.connect(URL, name('sender'));
    const r = await Agent.connect(URL, readerId);
    const seen: string[] = [];
    const served = r.serve(async (m) => {
      seen.push(m.body);
      if (m.body === 'poison') throw new Error(`cannot digest ${m.body}`);
    }, { stopSignals: [], onError: () => undefined });
    try {
      await s.send(readerId, 'poison');
      await s.send(readerId, 'bread');
      await until(() => seen.includes('bread'));
      assert.deepEqual(seen, ['poison', 'bread']);
      // Not lost: in the dead letters, with the error's text.
      assert.equal(await lastDeadLetterReason(s, r.goalId!),
        'rejected by its reader: cannot digest poison');
      await s.send(readerId, 'water');
      await until(() => seen.includes('water'));
      assert.deepEqual(seen, ['poison', 'bread', 'water']);
    } finally {
      await r.close();
      await served;
      await s.close();
    }
  });

test('a handler that throws on a task: its requester sees it end with the reason, the loop goes on',
  async () => {
    const workerId = name('flaky');
    const a = await Agent.connect(URL, name('requester'));
    const w = await Agent.connect(URL, workerId);
    const seen: string[] = [];
    const served = w.serve(async (m) => {
      if (m.kind === 'task') {
        if (m.body !== 'refuse') {
          const task = await m.task().accept();
          if (m.body === 'start, then throw') await task.start();
        }
        throw new Error(`cannot do ${m.body}`);
      }
      seen.push(m.body);
    }, { stopSignals: [], onError: () => undefined });
    /** The task's end as its requester sees it, within two seconds. */
    const ended = async (task: Awaited<ReturnType<Agent['createTask']>>) => {
      const started = Date.now();
      const over = ['completed', 'failed', 'rejected', 'canceled'];
      while (!over.includes((await task.refresh()).state ?? '')) {
        assert.ok(Date.now() - started < 2000, `still ${task.state} after 2 s`);
        await sleep(50);
      }
      return [task.state, task.reason];
    };
    try {
      // Thrown before accepting: rejected, with the error's text.
      const refused = await a.createTask(workerId, 'refuse', { deadlineInMs: 60_000 });
      assert.deepEqual(await ended(refused), ['rejected', 'cannot do refuse']);
      // Thrown after accepting (and after starting): failed, with the text.
      const accepted = await a.createTask(workerId, 'accept, then throw');
      assert.deepEqual(await ended(accepted), ['failed', 'cannot do accept, then throw']);
      const started = await a.createTask(workerId, 'start, then throw');
      assert.deepEqual(await ended(started), ['failed', 'cannot do start, then throw']);
      assert.deepEqual(started.record.history?.map((step) => step.op), ['accept', 'start', 'fail']);
      // The loop goes on, and the task messages were acknowledged, not dead letters.
      await a.send(workerId, 'after them');
      await until(() => seen.includes('after them'));
      assert.equal(await lastDeadLetterReason(a, w.goalId!), undefined);
    } finally {
      await w.close();
      await served;
      await a.close();
    }
  });

test('a restarted agent resumes its named goal and reads what came while it was down',
  async () => {
    const workerId = name('worker');
    const s = await Agent.connect(URL, name('sender'));
    const first = await Agent.connect(URL, workerId, { goal: 'worker-1' });
    const goalId = first.goalId!;
    try {
      assert.equal(first.goalName, 'worker-1');
      await s.send(workerId, 'one');
      // The loop body throws: the message stays unacknowledged and the goal open.
      await assert.rejects((async () => {
        for await (const m of first.messages({ waitMs: 200 })) throw new Error(`crash on ${m.body}`);
      })(), /crash on one/);
      await first.close({ keepGoal: true }); // the process dies: nothing is closed
      const report = await s.send(workerId, 'two'); // while it is down
      assert.deepEqual(report.delivered_to, [goalId]);

      const again = await Agent.connect(URL, workerId, { goal: 'worker-1' });
      try {
        assert.equal(again.goalId, goalId);
        const bodies = [];
        for (let m; (m = await again.nextMessage({ waitMs: 1000 })); ) bodies.push(m.body);
        assert.deepEqual(bodies, ['one', 'two']);
        assert.deepEqual((await s.lookup(workerId)).live_goals, [goalId]);
        // Another name is another goal; the default name is "main".
        const other = await Agent.connect(URL, name('worker'));
        assert.equal(other.goalName, 'main');
        await other.close();
      } finally {
        await again.close();
      }
    } finally {
      await s.close();
    }
  });

test('serve runs up to maxConcurrent handlers and acknowledges every message', async () => {
  const workerId = name('pool');
  const s = await Agent.connect(URL, name('sender'));
  const w = await Agent.connect(URL, workerId, { goal: 'pool' });
  try {
    for (let i = 0; i < 10; i++) await s.send(workerId, `job ${i}`);
    let active = 0;
    let peak = 0;
    const done: string[] = [];
    const served = w.serve(async (m) => {
      active += 1;
      peak = Math.max(peak, active);
      // Later jobs finish first: acknowledgements must still only cover finished work.
      await sleep(400 - 30 * Number(m.body.split(' ')[1]));
      if (m.body === 'job 3') throw new Error('job 3 is broken');
      active -= 1;
      done.push(m.body);
    }, { maxConcurrent: 4, stopSignals: [], onError: () => { active -= 1; } });
    await until(() => done.length === 9);
    assert.equal(peak, 4);
    assert.equal(active, 0);
    await w.close({ keepGoal: true });
    await served;
    // Every message is acknowledged (job 3 rejected): nothing is left unread for a restart.
    const again = await Agent.connect(URL, workerId, { goal: 'pool' });
    try {
      assert.equal(again.goalId, w.goalId);
      assert.equal(await again.nextMessage({ waitMs: 500 }), undefined);
      assert.equal(await lastDeadLetterReason(s, w.goalId!), 'rejected by its reader: job 3 is broken');
    } finally {
      await again.close();
    }
  } finally {
    await s.close();
  }
});

test('serve acks ride on the next fetch; the last goes on its own after ACK_LINGER_MS',
  async () => {
    // Issue 40: a busy goal's acks cost no request of their own.
    const workerId = name('acker');
    const a = await Agent.connect(URL, name('caller'));
    const w = await Agent.connect(URL, workerId);
    const alone: unknown[] = [];
    const tap = a.nc.subscribe(`agent.inbox.ack.${workerId}`, { callback: (_e, m) => { alone.push(m); } });
    await a.nc.flush();
    const served = w.serve(async (m) => {
      if (m.isCall) await m.reply(m.body);
    }, { stopSignals: [] });
    try {
      const calls = 40;
      for (let i = 0; i < calls; i++) {
        assert.equal((await a.call(workerId, `q${i}`, { timeoutMs: 10_000 })).body, `q${i}`);
      }
      const unread = async () => {
        const reply = await w.nc.request(`agent.inbox.fetch.${workerId}`,
          JSON.stringify({ goal_id: w.goalId, peek: true }), { timeout: 5000 });
        return reply.json<{ unread: number }>().unread;
      };
      for (const end = Date.now() + 40 * ACK_LINGER_MS; await unread() !== 0;) {
        assert.ok(Date.now() < end, 'every message acknowledged soon after the last call');
        await sleep(20);
      }
      await sleep(100);
      assert.ok(alone.length >= 1 && alone.length < calls / 4,
        `${alone.length} of ${calls} acks went alone`);
    } finally {
      tap.unsubscribe();
      await w.close();
      await served;
      await a.close();
    }
  });

test('a stream ends with no final text', async () => {
  const writerId = name('writer');
  const a = await Agent.connect(URL, name('caller'));
  const w = await Agent.connect(URL, writerId);
  const served = w.serve(async (m) => {
    if (!m.isCall) return;
    await m.replyPart(1, 'one ');
    await m.replyPart(2, 'two');
    await m.endStream();
  }, { stopSignals: [] });
  try {
    const events = [];
    for await (const event of a.callStream(writerId, 'draft', { timeoutMs: 10_000 })) {
      events.push(event);
    }
    assert.deepEqual(events.map((e) => ('partial' in e ? e.part : 'end')), [1, 2, 'end']);
    const answer = events.at(-1)!;
    assert.ok(!('partial' in answer));
    assert.equal(answer.body, 'one two');
    assert.equal(answer.streamed, 2);
    // A caller that does not stream gets the joined text.
    assert.equal((await a.call(writerId, 'draft', { timeoutMs: 10_000 })).body, 'one two');
  } finally {
    await w.close();
    await served;
    await a.close();
  }
});

test('SIGTERM stops a serving agent gracefully: the call in progress is answered', async () => {
  const workerId = name('slow');
  const fixture = join(dirname(fileURLToPath(import.meta.url)), 'fixtures', 'slow-worker.js');
  const child = spawn(process.execPath, [fixture, URL, workerId],
    { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  child.stdout.setEncoding('utf8').on('data', (chunk: string) => { out += chunk; });
  const exited = new Promise<number | null>((resolve) => child.on('exit', resolve));
  const a = await Agent.connect(URL, name('caller'));
  try {
    await until(() => out.includes('ready'));
    const answer = a.call(workerId, 'take your time', { timeoutMs: 10_000 });
    await until(() => out.includes('started'));
    child.kill('SIGTERM');
    assert.equal((await answer).body, 'done: take your time');
    assert.equal(await exited, 0);
    assert.match(out, /started[\s\S]*finished[\s\S]*stopped/);
    // It closed its goal and left.
    const after = await a.lookup(workerId);
    assert.equal(after.status, 'offline');
    assert.deepEqual(after.live_goals, []);
  } finally {
    child.kill('SIGKILL');
    await a.close();
  }
});
