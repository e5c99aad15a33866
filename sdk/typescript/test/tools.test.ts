// The fabric as LLM tools (src/tools.ts) against a real fabric (SWITCHBOARD_NATS_URL): recorded
// tool calls of OpenAI Chat Completions, the OpenAI Responses API and Anthropic Messages
// (test/fixtures/*.json; the test puts its agents' ids in place of {{PEER}} and {{TASK_ID}})
// run as agents, and what the fabric did is checked: messages delivered and read, calls
// answered, tasks worked through their states. A bad call gives an error result, never an
// exception.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import {
  Agent, anthropicTools, openaiResponsesTools, openaiTools, Toolbox, toolDefinitions,
} from '../src/index.js';
import type {
  AnthropicToolResult, AnthropicToolUse, OpenAIResponsesToolCall, OpenAIToolCall, ToolCall,
} from '../src/index.js';

const URL = process.env.SWITCHBOARD_NATS_URL ?? 'nats://127.0.0.1:4222';
const name = (prefix: string) => `${prefix}-${randomUUID().slice(0, 8)}`;
const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** A recorded payload with the placeholders replaced (`{{PEER}}` → `values.PEER`). */
function fixture<T = any>(file: string, values: Record<string, string> = {}): T {
  let text = readFileSync(join(root, 'test', 'fixtures', file), 'utf8');
  for (const [key, value] of Object.entries(values)) text = text.replaceAll(`{{${key}}}`, value);
  assert.doesNotMatch(text, /\{\{[A-Z_]+\}\}/, `${file}: a placeholder left`);
  return JSON.parse(text) as T;
}

/** The JSON of a successful result (it must not be an error). */
function ok(content: string): any {
  const value = JSON.parse(content);
  assert.ok(!(value && typeof value === 'object' && 'error' in value && !('correlation_id' in value)),
    `an error result: ${content}`);
  return value;
}

/** The `{kind, message}` of an error result. */
function failed(content: string): { kind: string; message: string } {
  const value = JSON.parse(content);
  assert.ok(value.error, `not an error result: ${content}`);
  assert.deepEqual(Object.keys(value), ['error']);
  return value.error;
}

/** Runs check_inbox as `agent` until its block shows `wanted` (messages may take a moment). */
async function inboxUntil(agent: Agent, wanted: RegExp, seen: string[] = []): Promise<string> {
  for (let i = 0; i < 100; i++) {
    const outcome = await agent.tools.call('check_inbox', {});
    assert.equal(outcome.isError, false, outcome.content);
    seen.push(outcome.content);
    if (wanted.test(outcome.content)) return outcome.content;
    await sleep(100);
  }
  throw new Error(`check_inbox never showed ${wanted}: ${seen.join('\n---\n')}`);
}

test('the definitions are docs/mcp-tools.json, in the OpenAI and Anthropic formats', async () => {
  const mcp = JSON.parse(readFileSync(join(root, '..', '..', 'docs', 'mcp-tools.json'), 'utf8')) as
    { name: string; description: string; inputSchema: Record<string, unknown> }[];
  assert.equal(mcp.length, 18);
  assert.deepEqual(toolDefinitions(), mcp);
  assert.deepEqual(openaiTools(), mcp.map((tool) => ({ type: 'function',
    function: { name: tool.name, description: tool.description, parameters: tool.inputSchema } })));
  assert.deepEqual(openaiResponsesTools(), mcp.map((tool) => ({ type: 'function',
    name: tool.name, description: tool.description, parameters: tool.inputSchema })));
  assert.deepEqual(anthropicTools(), mcp.map((tool) => ({ name: tool.name,
    description: tool.description, input_schema: tool.inputSchema })));
  // Copies: what a caller changes does not change the next answer.
  const tools = anthropicTools();
  (tools[0].input_schema as { type: string }).type = 'changed';
  tools.pop();
  assert.deepEqual(anthropicTools(), mcp.map((tool) => ({ name: tool.name,
    description: tool.description, input_schema: tool.inputSchema })));
  const agent = await Agent.connect(URL, name('defs'), { openGoal: false });
  try {
    assert.equal(agent.tools, agent.tools, 'one Toolbox per agent');
    assert.deepEqual(agent.tools.openai(), openaiTools());
    assert.deepEqual(agent.tools.anthropic(), anthropicTools());
  } finally {
    await agent.close();
  }
});

test('a recorded OpenAI turn: list_peers, send_to_peer and create_task; the peer reads them with '
  + 'a recorded Anthropic turn and works the task', async () => {
  const requesterId = name('release-manager');
  const peerId = name('proofreader');
  const requester = await Agent.connect(URL, requesterId, { description: 'ships releases' });
  const peer = await Agent.connect(URL, peerId, { description: 'proofreads docs' });
  try {
    const completion = fixture('openai-chat-completion.json', { PEER: peerId });
    const message = completion.choices[0].message as { tool_calls: OpenAIToolCall[] };
    const results = await requester.tools.runAll(message);
    assert.deepEqual(results.map((r) => [r.role, r.tool_call_id]),
      message.tool_calls.map((call) => ['tool', call.id]));

    // list_peers: the directory's page, the peer in it as it registered.
    const peers = ok(results[0].content).peers as { agent_id: string; description: string;
      reachable: boolean }[];
    const found = peers.find((p) => p.agent_id === peerId);
    assert.deepEqual([found?.description, found?.reachable], ['proofreads docs', true]);
    assert.ok(!peers.some((p) => p.agent_id === requesterId), 'not itself');

    // send_to_peer: the delivery report names the peer's goal.
    const report = ok(results[1].content);
    assert.deepEqual(report.delivered_to, [peer.goalId]);
    assert.deepEqual(report.unreachable_reasons, []);

    // create_task: the task record, submitted, for the peer.
    const created = ok(results[2].content);
    assert.equal(created.task.state, 'submitted');
    assert.equal(created.task.assignee, peerId);
    assert.equal(created.task.requester, requesterId);
    assert.equal(created.task.message,
      'Proofread docs/releases/4.2.1.md and report any broken links.');
    assert.deepEqual(created.delivered_to, [peer.goalId]);
    const taskId = created.task.task_id as string;

    // The peer's model calls check_inbox (Anthropic): one block with both messages, each shown
    // once.
    const reading = fixture('anthropic-check-inbox.json');
    let block = '';
    for (let i = 0; i < 50 && !block.includes(`task_id="${taskId}"`); i++) {
      const [result] = await peer.tools.runAll(reading.content as (AnthropicToolUse | { type: 'text' })[]);
      assert.deepEqual([result.type, result.tool_use_id, result.is_error],
        ['tool_result', 'toolu_01A09q90qw90lq917835lq9', false]);
      block += result.content;
      if (!block.includes(`task_id="${taskId}"`)) await sleep(100);
    }
    assert.ok(block.startsWith('# PEER MESSAGES\n'), block);
    assert.ok(block.includes(`<peer-message from="${requesterId}" sent_at="`), block);
    assert.ok(block.includes(` message_id="${report.message_id}">\nHeads up: the 4.2.1 release `
      + 'notes are ready for review in docs/releases/4.2.1.md.\n</peer-message>\n'), block);
    assert.ok(block.includes(`kind="task" task_id="${taskId}" task_state="submitted">\n`
      + 'Proofread docs/releases/4.2.1.md and report any broken links.\n</peer-message>'), block);
    assert.equal((await peer.tools.call('check_inbox', {})).content, 'No new messages.');

    // Taken means read: the requester's read receipt, and message_status says so.
    let goals: { agent_id: string; state: string }[] = [];
    for (let i = 0; i < 50 && goals[0]?.state !== 'read'; i++) {
      const status = await requester.tools.call('message_status',
        JSON.stringify({ message_id: report.message_id }));
      goals = ok(status.content).goals;
      if (goals[0]?.state !== 'read') await sleep(100);
    }
    assert.deepEqual(goals.map((g) => [g.agent_id, g.state]), [[peerId, 'read']]);

    // The peer's next turn (Anthropic): accept, start, a subagent, its status, complete.
    const work = fixture<{ content: (AnthropicToolUse | { type: 'text'; text: string })[] }>(
      'anthropic-work-task.json', { TASK_ID: taskId });
    const done = await peer.tools.runAll(work);
    assert.equal(done.length, 5, 'the text block is skipped');
    for (const result of done) assert.equal(result.is_error, false, result.content);
    assert.equal(ok(done[0].content).task.state, 'accepted');
    assert.equal(ok(done[1].content).task.state, 'working');
    const sub = ok(done[2].content).task;
    assert.deepEqual([sub.parent, sub.assignee, sub.depth], [taskId, peerId, 2]);
    const subtasks = ok(done[3].content) as { task_id: string; parent: string }[];
    assert.deepEqual(subtasks.map((t) => [t.task_id, t.parent]), [[sub.task_id, taskId]]);
    const completed = ok(done[4].content).task;
    assert.deepEqual([completed.state, completed.result], ['completed',
      'No broken links: all 14 links in docs/releases/4.2.1.md resolve.']);

    // The requester sees the result: subagent_status, and the task_update in its inbox.
    const status = await requester.tools.call('subagent_status', { task_id: taskId });
    assert.deepEqual([ok(status.content).state, ok(status.content).result],
      ['completed', 'No broken links: all 14 links in docs/releases/4.2.1.md resolve.']);
    await inboxUntil(requester, new RegExp(`kind="task_update" task_id="${taskId}" `
      + 'task_state="completed"'));

    // A task the requester no longer needs: cancel_task.
    const second = ok((await requester.tools.call('create_task',
      { to: peerId, message: 'Also translate the notes into German.' })).content).task;
    const canceled = await requester.tools.call('cancel_task',
      { task_id: second.task_id, reason: 'German is out of scope' });
    assert.deepEqual([ok(canceled.content).task.state, ok(canceled.content).task.reason],
      ['canceled', 'German is out of scope']);
    const again = await requester.tools.call('cancel_task', { task_id: second.task_id });
    assert.equal(ok(again.content).duplicate, true, 'the same step again changes nothing');
    const late = await requester.tools.call('cancel_task', { task_id: taskId });
    assert.equal(late.isError, true);
    assert.equal(failed(late.content).kind, 'task_terminal');
  } finally {
    await peer.close();
    await requester.close();
  }
});

test('talk_to_agent (a recorded Responses API call) waits for a peer served by serve()',
  async () => {
    const askerId = name('asker');
    const translatorId = name('translator');
    const asker = await Agent.connect(URL, askerId);
    const translator = await Agent.connect(URL, translatorId);
    const served = translator.serve(async (message) => {
      if (!message.isCall) return;
      if (message.body === 'How do you say good morning in French?') {
        await message.replyPart(1, 'Bon');
        await message.reply('jour');
      } else {
        await message.replyError('no_idea', `I cannot translate ${message.body}`);
      }
    }, { stopSignals: [] });
    try {
      const progress: unknown[] = [];
      const tools = new Toolbox(asker, { onProgress: (event) => progress.push(event) });
      const response = fixture('openai-responses.json', { PEER: translatorId });
      const [result] = await tools.runAll(response as { output: OpenAIResponsesToolCall[] });
      assert.deepEqual([result.type, result.call_id],
        ['function_call_output', 'call_Vw4Hk8Rt2Ym6Qp1Zs9Lc3Nb7']);
      const answer = ok(result.output);
      assert.deepEqual([answer.from_agent_id, answer.body, answer.streamed],
        [translatorId, 'Bonjour', 1]);
      assert.deepEqual(progress, [{ tool: 'talk_to_agent', to: translatorId, part: 1,
        text: 'Bon' }]);

      // An error answer is the callee's answer, as `switchboard mcp` returns it.
      const refused = await asker.tools.call('talk_to_agent',
        { to: translatorId, message: 'Klingon?', timeout_ms: 10_000 });
      assert.equal(refused.isError, false);
      assert.deepEqual(ok(refused.content).error,
        { kind: 'no_idea', message: 'I cannot translate Klingon?' });

      // No such agent: an error result with the correlator's kind.
      const nobody = await asker.tools.call('talk_to_agent',
        { to: name('nobody'), message: 'hello?', timeout_ms: 2000 });
      assert.equal(nobody.isError, true);
      assert.equal(failed(nobody.content).kind, 'unreachable');
    } finally {
      await translator.close();
      await served;
      await asker.close();
    }
  });

test('reply_to_peer answers the request check_inbox showed, in parts', async () => {
  const askerId = name('asker');
  const expertId = name('expert');
  const asker = await Agent.connect(URL, askerId);
  const expert = await Agent.connect(URL, expertId);
  try {
    const asked = asker.tools.run({ id: 'call_ask', type: 'function', function: {
      name: 'talk_to_agent',
      arguments: JSON.stringify({ to: expertId, message: 'Which port does NATS use?',
        timeout_ms: 20_000 }) } });
    const block = await inboxUntil(expert, /kind="request"/);
    assert.ok(block.includes(`<peer-message from="${askerId}"`), block);
    assert.ok(block.includes('>\nWhich port does NATS use?\n</peer-message>'), block);
    const correlationId = /correlation_id="([^"]+)"/.exec(block)![1];
    const pending = ok((await expert.tools.call('pending_requests', {})).content);
    assert.deepEqual(pending.incoming.map((c: { correlation_id: string; caller: string }) =>
      [c.correlation_id, c.caller]), [[correlationId, askerId]]);

    const part = await expert.tools.run({ type: 'tool_use', id: 'toolu_part',
      name: 'reply_to_peer', input: { message: '4222 for clients, ', partial: true } });
    assert.equal(part.is_error, false, part.content);
    const last = await expert.tools.run({ type: 'tool_use', id: 'toolu_last',
      name: 'reply_to_peer', input: { message: '8222 for monitoring.' } });
    assert.equal(last.is_error, false, last.content);
    assert.equal(ok(last.content).correlation_id, correlationId);

    const result = await asked;
    assert.equal(result.tool_call_id, 'call_ask');
    const answer = ok(result.content);
    assert.deepEqual([answer.correlation_id, answer.body, answer.streamed],
      [correlationId, '4222 for clients, 8222 for monitoring.', 1]);

    // Nothing is waiting any more.
    const none = await expert.tools.call('reply_to_peer', { message: 'and more' });
    assert.deepEqual(failed(none.content), { kind: 'not_found',
      message: 'no request is waiting for your answer; use send_to_peer to message a peer' });
  } finally {
    await expert.close();
    await asker.close();
  }
});

test('bad calls give error results in the call\'s format, never exceptions', async () => {
  const agentId = name('clumsy');
  const peerId = name('peer');
  const agent = await Agent.connect(URL, agentId);
  const peer = await Agent.connect(URL, peerId);
  try {
    const cases = fixture<{ why: string; call: ToolCall; message: string }[]>('bad-calls.json',
      { PEER: peerId });
    for (const { why, call, message } of cases) {
      const result = await agent.tools.run(call) as unknown as Record<string, unknown>;
      const content = (result.content ?? result.output) as string;
      const error = failed(content);
      assert.equal(error.kind, 'bad_request', `${why}: ${content}`);
      assert.ok(error.message.startsWith(message), `${why}: ${error.message}`);
      if ('function' in call) {
        assert.deepEqual(Object.keys(result), ['role', 'tool_call_id', 'content']);
        assert.equal(result.tool_call_id, call.id);
      } else if (call.type === 'function_call') {
        assert.deepEqual(Object.keys(result), ['type', 'call_id', 'output']);
        assert.equal(result.call_id, call.call_id);
      } else {
        assert.deepEqual([result.type, result.tool_use_id, result.is_error],
          ['tool_result', call.id, true]);
      }
    }

    // Arguments past the bound (256 KiB) are refused unread.
    const huge = await agent.tools.run({ id: 'call_huge', type: 'function', function: {
      name: 'send_to_peer',
      arguments: JSON.stringify({ to: peerId, message: 'x'.repeat(300 * 1024) }) } });
    assert.match(failed(huge.content).message, /^send_to_peer: the arguments are \d+ bytes, more than 262144$/);
    const small = new Toolbox(agent, { maxArgumentBytes: 64 });
    const refused = await small.run({ type: 'tool_use', id: 'toolu_big', name: 'send_to_peer',
      input: { to: peerId, message: 'a message longer than sixty-four bytes, as JSON' } });
    assert.equal(refused.is_error, true);
    assert.equal(failed(refused.content).kind, 'bad_request');

    // A service's refusal keeps its kind.
    const self = await agent.tools.call('send_to_peer', { to: agentId, message: 'me?' });
    assert.equal(failed(self.content).kind, 'self_send');
    const unknown = await agent.tools.call('subagent_status', { task_id: randomUUID() });
    assert.equal(failed(unknown.content).kind, 'not_found');

    // Extra fields are ignored and nulls are absent, as the MCP server reads them; empty
    // arguments are `{}`.
    const sent = await agent.tools.call('send_to_peer', JSON.stringify({ to: peerId,
      message: 'hello', receipt: null, mood: 'cheerful' }));
    assert.deepEqual(ok(sent.content).delivered_to, [peer.goalId]);
    const empty = await agent.tools.run({ id: 'call_empty', type: 'function',
      function: { name: 'pending_requests', arguments: '' } });
    assert.deepEqual(ok(empty.content), { outgoing: [], incoming: [] });

    // Not a tool call at all is the program's mistake, not the model's.
    await assert.rejects(agent.tools.run({ type: 'text', text: 'hi' } as unknown as ToolCall),
      TypeError);
    const none: AnthropicToolResult[] = await agent.tools.runAll(
      [{ type: 'text' as const, text: 'Nothing to do.' }]);
    assert.deepEqual(none, []);
  } finally {
    await peer.close();
    await agent.close();
  }
});
