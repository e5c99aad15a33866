// Signing in as NATS users do (src/connection.ts): NATS CLI contexts against the open fabric of
// SWITCHBOARD_NATS_URL, and creds and NKey seed files against a secured fabric this file starts
// itself (`switchboard nats-config`, then `switchboard up --auth`) when SWITCHBOARD_BIN names the
// switchboard binary; that part is skipped when it is unset.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';

import { nkeys } from '@nats-io/transport-node';

import { Agent, contextDir, readContext } from '../src/index.js';

const URL = process.env.SWITCHBOARD_NATS_URL ?? 'nats://127.0.0.1:4222';
const name = (prefix: string) => `${prefix}-${randomUUID().slice(0, 8)}`;

/** Runs `body` with XDG_CONFIG_HOME set to a fresh folder holding `contexts` (name → JSON),
 * and NATS_CONTEXT unset. */
async function withContexts(contexts: Record<string, unknown>,
  body: (config: string) => Promise<void>): Promise<void> {
  const config = mkdtempSync(join(tmpdir(), 'sb-xdg-'));
  const before = process.env.XDG_CONFIG_HOME;
  const contextBefore = process.env.NATS_CONTEXT;
  process.env.XDG_CONFIG_HOME = config;
  delete process.env.NATS_CONTEXT;
  try {
    mkdirSync(join(config, 'nats', 'context'), { recursive: true });
    for (const [ctx, value] of Object.entries(contexts)) {
      writeFileSync(join(config, 'nats', 'context', `${ctx}.json`),
        typeof value === 'string' ? value : JSON.stringify(value, null, 2));
    }
    await body(config);
  } finally {
    if (before === undefined) delete process.env.XDG_CONFIG_HOME;
    else process.env.XDG_CONFIG_HOME = before;
    if (contextBefore === undefined) delete process.env.NATS_CONTEXT;
    else process.env.NATS_CONTEXT = contextBefore;
    rmSync(config, { recursive: true, force: true });
  }
}

test('a NATS CLI context gives the URL; an explicit URL wins over it', async () => {
  await withContexts({
    fabric: { description: 'the test fabric', url: URL, inbox_prefix: '_INBOX_ignored' },
    elsewhere: { url: 'nats://127.0.0.1:1' },
  }, async (config) => {
    assert.equal(contextDir(), join(config, 'nats', 'context'));
    assert.equal(readContext('fabric').url, URL);
    const peerId = name('ctx-peer');
    const peer = await Agent.connect(undefined, peerId, { context: 'fabric' });
    const other = await Agent.connect(URL, name('ctx-url'), { context: 'elsewhere' });
    try {
      const report = await other.send(peerId, 'found you through a context');
      assert.deepEqual(report.delivered_to, [peer.goalId]);
      const got = await peer.nextMessage({ waitMs: 5000 });
      assert.equal(got?.body, 'found you through a context');
    } finally {
      await other.close();
      await peer.close();
    }
  });
});

test('$NATS_CONTEXT names the context when neither a URL nor `context` is given', async () => {
  await withContexts({ fabric: { url: URL }, elsewhere: { url: 'nats://127.0.0.1:1' } },
    async (config) => {
      process.env.NATS_CONTEXT = 'fabric';
      const peerId = name('env-ctx');
      const peer = await Agent.connect(undefined, peerId);   // the URL of $NATS_CONTEXT's
      // `context` wins over $NATS_CONTEXT, and so does a URL given (the context is not read).
      process.env.NATS_CONTEXT = 'elsewhere';
      const other = await Agent.connect(null, name('env-ctx'), { context: 'fabric' });
      process.env.NATS_CONTEXT = 'nope';
      const third = await Agent.connect(URL, name('env-ctx'));
      try {
        const report = await other.send(peerId, 'found through $NATS_CONTEXT');
        assert.deepEqual(report.delivered_to, [peer.goalId]);
        assert.equal((await peer.nextMessage({ waitMs: 5000 }))?.body,
          'found through $NATS_CONTEXT');
        assert.equal((await third.lookup(peerId)).live_goals.length, 1);
      } finally {
        await Promise.all([third.close(), other.close(), peer.close()]);
      }
      // A $NATS_CONTEXT that names no context is an error naming it, before connecting.
      await assert.rejects(Agent.connect(undefined, name('env-ctx')),
        (err: Error) => err.message === `NATS context "nope": ${join(config, 'nats', 'context',
          'nope.json')}: no such file`);
      process.env.NATS_CONTEXT = '';
      await assert.rejects(Agent.connect(undefined, name('env-ctx')), /no NATS URL/);
    });
});

test('context names that leave the context folder are refused; missing files are named',
  async () => {
    await withContexts({ fabric: { url: URL }, nourl: { description: 'no url' },
      broken: '{"url": ', list: '[]' }, async (config) => {
      // A context file one folder up that `../fabric` would reach: never read.
      writeFileSync(join(config, 'nats', 'fabric.json'), JSON.stringify({ url: URL }));
      for (const bad of ['../fabric', '..', 'a/b', 'a\\b', '', 'x/../fabric']) {
        await assert.rejects(Agent.connect(undefined, name('ctx'), { context: bad }),
          /not a context name/, JSON.stringify(bad));
      }
      await assert.rejects(Agent.connect(undefined, name('ctx'), { context: 'nope' }),
        (err: Error) => err.message === `NATS context "nope": ${join(config, 'nats', 'context',
          'nope.json')}: no such file`);
      await assert.rejects(Agent.connect(undefined, name('ctx'), { context: 'nourl' }),
        /NATS context "nourl" .*: no `url`: give the NATS URL to connect/);
      await assert.rejects(Agent.connect(undefined, name('ctx'), { context: 'broken' }),
        /NATS context "broken": .*broken\.json is not JSON/);
      await assert.rejects(Agent.connect(undefined, name('ctx'), { context: 'list' }),
        /list\.json is not a JSON object/);
      await assert.rejects(Agent.connect(undefined, name('ctx')), /no NATS URL/);

      const missing = join(config, 'missing.creds');
      await assert.rejects(Agent.connect(URL, name('ctx'), { creds: missing }),
        (err: Error) => err.message === `NATS credentials file (creds) ${missing}: no such file`);
      await assert.rejects(Agent.connect(URL, name('ctx'), { nkeySeed: join(config, 'a.nk') }),
        /NKey seed file \(nkeySeed\) .*a\.nk: no such file/);
      writeFileSync(join(config, 'bad.nk'), 'not a seed\n');
      await assert.rejects(Agent.connect(URL, name('ctx'), { nkeySeed: join(config, 'bad.nk') }),
        /bad\.nk: not an NKey seed/);
      writeFileSync(join(config, 'bad.creds'), 'not creds\n');
      await assert.rejects(Agent.connect(URL, name('ctx'), { creds: join(config, 'bad.creds') }),
        /bad\.creds: not a NATS credentials file/);
      await assert.rejects(Agent.connect(URL, name('ctx'), { creds: missing, nkeySeed: missing }),
        /give `creds` or `nkeySeed`, not both/);
      writeFileSync(join(config, 'nats', 'context', 'nocreds.json'),
        JSON.stringify({ url: URL, creds: join(config, 'gone.creds') }));
      await assert.rejects(Agent.connect(undefined, name('ctx'), { context: 'nocreds' }),
        /NATS context "nocreds" .*credentials file \(creds\) .*gone\.creds: no such file/);
      writeFileSync(join(config, 'nats', 'context', 'noca.json'),
        JSON.stringify({ url: URL, ca: join(config, 'ca.pem') }));
      await assert.rejects(Agent.connect(undefined, name('ctx'), { context: 'noca' }),
        /NATS context "noca" .*TLS file \(ca\) .*ca\.pem: no such file/);
    });
  });

// ------------------------------------------------------------------- a secured fabric
const BIN = process.env.SWITCHBOARD_BIN;

/** A free loopback port. */
async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolve(port));
    });
  });
}

/** A NATS credentials file for `seed`: a user JWT (signed by a throwaway account key) and the
 * seed, in the layout `nsc` writes. */
function credsFile(seed: string, user: string): string {
  const key = nkeys.fromSeed(new TextEncoder().encode(seed));
  const account = nkeys.createAccount();
  const part = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64url');
  const head = `${part({ typ: 'JWT', alg: 'ed25519-nkey' })}.${part({
    jti: randomUUID(), iat: Math.floor(Date.now() / 1000), iss: account.getPublicKey(),
    name: user, sub: key.getPublicKey(),
    nats: { pub: {}, sub: {}, subs: -1, data: -1, payload: -1, type: 'user', version: 2 },
  })}`;
  const jwt = `${head}.${Buffer.from(account.sign(new TextEncoder().encode(head))).toString('base64url')}`;
  return `-----BEGIN NATS USER JWT-----\n${jwt}\n------END NATS USER JWT------\n\n`
    + '************************* IMPORTANT *************************\n'
    + 'NKEY Seed printed below can be used to sign and prove identity.\n'
    + 'NKEYs are sensitive and should be treated as secrets.\n\n'
    + `-----BEGIN USER NKEY SEED-----\n${seed}\n------END USER NKEY SEED------\n\n`
    + '*************************************************************\n';
}

/** `switchboard up --auth` on a free port, up once its banner is printed. */
async function securedFabric(dir: string): Promise<{ url: string; up: ChildProcess }> {
  const env = { ...process.env };
  delete env.SWITCHBOARD_NATS__NKEY_FILE;
  delete env.SWITCHBOARD_NATS__NKEY_SEED;
  const made = spawnSync(BIN!, ['nats-config', '--agents', join(dir, 'agents.toml'),
    '--out', join(dir, 'auth')], { encoding: 'utf8', env });
  assert.equal(made.status, 0, made.stderr);
  const port = await freePort();
  const up = spawn(BIN!, ['up', '--auth', join(dir, 'auth'), '--port', String(port),
    '--data-dir', join(dir, 'data'), '--a2a-listen', '127.0.0.1:0', '--metrics-listen', 'off'],
  { cwd: dir, env, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  up.stderr!.setEncoding('utf8').on('data', (chunk: string) => { err = (err + chunk).slice(-4000); });
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no banner in 60 s:\n${out}\n${err}`)), 60_000);
    up.stdout!.setEncoding('utf8').on('data', (chunk: string) => {
      out += chunk;
      if (out.includes('Switchboard is up.') && out.includes('services:')) {
        clearTimeout(timer);
        resolve();
      }
    });
    up.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`switchboard up exited (${code}):\n${out}\n${err}`));
    });
  });
  assert.match(out, /access: +accounts from/);
  return { url: `nats://127.0.0.1:${port}`, up };
}

async function stop(up: ChildProcess): Promise<void> {
  if (up.exitCode !== null || up.signalCode !== null) return;
  const exited = new Promise((resolve) => up.once('exit', resolve));
  up.kill('SIGINT');
  const timer = setTimeout(() => up.kill('SIGKILL'), 15_000);
  await exited;
  clearTimeout(timer);
}

test('creds, NKey seed files and contexts sign in to a secured fabric',
  { skip: BIN ? false : 'SWITCHBOARD_BIN is not set', timeout: 180_000 }, async () => {
    const dir = mkdtempSync(join(tmpdir(), 'sb-auth-'));
    writeFileSync(join(dir, 'agents.toml'), ['alice', 'bob', 'carol', 'dave', 'erin']
      .map((id) => `[[agents]]\nid = "ts-${id}"\n`).join(''));
    const { url, up } = await securedFabric(dir);
    const key = (id: string) => join(dir, 'auth', 'agents', `ts-${id}.nk`);
    const seed = (id: string) => readFileSync(key(id), 'utf8').trim();
    const agents: Agent[] = [];
    try {
      // An NKey seed file, as `switchboard nats-config` wrote it.
      const alice = await Agent.connect(url, 'ts-alice', { nkeySeed: key('alice') });
      agents.push(alice);
      // A credentials file (a user JWT and the seed; these accounts are NKey users, so the
      // server checks the seed's signature).
      writeFileSync(join(dir, 'bob.creds'), credsFile(seed('bob'), 'ts-bob'));
      const bob = await Agent.connect(url, 'ts-bob', { creds: join(dir, 'bob.creds') });
      agents.push(bob);
      // The seed itself, as before.
      const carol = await Agent.connect(url, 'ts-carol', { nkeySeed: seed('carol') });
      agents.push(carol);
      // NATS CLI contexts: one with an nkey, one with creds, each giving the URL.
      writeFileSync(join(dir, 'erin.creds'), credsFile(seed('erin'), 'ts-erin'));
      await withContexts({
        dave: { description: 'dave on the secured fabric', url, nkey: key('dave') },
        erin: { url, creds: join(dir, 'erin.creds') },
      }, async () => {
        agents.push(await Agent.connect(undefined, 'ts-dave', { context: 'dave' }));
        agents.push(await Agent.connect(undefined, 'ts-erin', { context: 'erin' }));
      });
      const peers = (await alice.listPeers()).map((peer) => peer.agent_id).sort();
      assert.deepEqual(peers, ['ts-bob', 'ts-carol', 'ts-dave', 'ts-erin']);
      for (const agent of agents.slice(1)) {
        const report = await agent.send('ts-alice', `hello from ${agent.id}`);
        assert.deepEqual(report.delivered_to, [alice.goalId]);
      }
      const block = (await alice.tools.call('check_inbox', {})).content;
      for (const id of ['bob', 'carol', 'dave', 'erin']) {
        assert.ok(block.includes(`from="ts-${id}"`) && block.includes(`hello from ts-${id}`), block);
      }

      // No key: the server refuses the connection.
      await assert.rejects(Agent.connect(url, name('nokey')), /Authorization Violation/i);
      // Another agent's key: signed in as that agent, which may not act as this one.
      await assert.rejects(Agent.connect(url, 'ts-bob', { nkeySeed: key('alice'),
        requestTimeoutMs: 3000 }), /Permissions Violation|no_responders|request_timeout/);
    } finally {
      for (const agent of agents.reverse()) await agent.close().catch(() => undefined);
      await stop(up);
      rmSync(dir, { recursive: true, force: true });
    }
  });
