// An agent on a Switchboard fabric (docs/protocol.md is the contract; sections cited below).
// The same surface as the Python SDK (sdk/python), with TypeScript names.

import { AsyncLocalStorage } from 'node:async_hooks';

import { connect, createInbox, headers, RequestError, TimeoutError } from '@nats-io/transport-node';
import type { Msg, MsgHdrs, NatsConnection } from '@nats-io/transport-node';

import { signIn } from './connection.js';
import type { SignIn } from './connection.js';
import { CallFailed, errorFor, SwitchboardError, Unavailable } from './errors.js';
import type { CallError } from './errors.js';
import * as files from './files.js';
import { Toolbox } from './tools.js';
import type {
  AgentCard, ApprovalUsed, Attachment, BudgetView, CallAnswer, CostReport, CallParked, CallPart, CallParts, DeliveryReport, FetchReply,
  GoalCloseReply, LookupReply, NoteReport, Parked, PeersReply, PendingCalls, PendingItems,
  Lease as LeaseReply, LimitView, PeopleList, PersonItem, Released, ReplyAck, SendRequest,
  SendStatusReply, TaskList, TaskReply,
} from './wire/index.js';

/** A message part (§7): text, data or a file reference. */
export type Part = NonNullable<SendRequest['parts']>[number];

type Json = Record<string, unknown>;

/** A new call id: a UUIDv7 (RFC 9562), its first 48 bits the time in milliseconds. A call whose
 * id was made moments ago has its record opened beside its request's delivery (docs/protocol.md
 * §9, "Call ids"); any other id still works, one round trip slower. */
export function callId(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  let ms = Date.now();
  for (let i = 5; i >= 0; i -= 1) {
    bytes[i] = ms % 256;
    ms = Math.floor(ms / 256);
  }
  bytes[6] = (bytes[6] & 0x0f) | 0x70; // version 7
  bytes[8] = (bytes[8] & 0x3f) | 0x80; // the RFC 9562 variant
  const hex = Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}
/** The task record every task op answers with (docs/schema/TaskReply.json). */
export type TaskRecord = TaskReply['task'];
/** W3C trace context carried by a request (§1 "Trace context"). */
export type Trace = { traceparent?: string; tracestate?: string };

/** A person (`person:alice`) or a role (`role:oncall`) of the people file (§14): a party an
 * agent notes, asks or gets an approval from. */
export type PartyId = `person:${string}` | `role:${string}`;

/** The reserved agent id persons' answers and the people service's notices come from (§14). */
export const PEOPLE_AGENT = 'people';
/** A valid person or role id: the prefix, then the agent-id rule. */
const PARTY = /^(?:person|role):[a-z0-9][a-z0-9_-]{0,63}$/;
/** The notices that end an ask or an approval nobody answered (§14, "Timeout notice"). */
const PERSON_TIMEOUTS = ['ask_timeout', 'approval_expired'];

/** Whether `to` names a person or a role by its prefix (`person:…`, `role:…`), valid or not:
 * what `send` and the `send_to_peer` tool note instead of sending (the people service refuses
 * an invalid one). */
export function isParty(to: string): to is PartyId {
  return to.startsWith('person:') || to.startsWith('role:');
}

/** An ack is sent again while no inbox service answers (it is idempotent). */
const ACK_ATTEMPTS = 5;
/** A fetch is sent again (without waiting) while no inbox service answers. */
const FETCH_ATTEMPTS = 5;
/** How long past its `wait_ms` a fetch's reply (or an ack's) may take before the reader stops
 * waiting for it and sends it again: the inbox replica holding it may have gone away. A fetch
 * or an ack is milliseconds of work; a reader that waited out the whole request timeout (10 s)
 * after each replica kill would fall behind its goal. */
export const INBOX_ATTEMPT_MS = 2_000;
const HEARTBEAT_EVERY_MS = 10_000; // §4.2: offline after 30 s of silence
const REQUEST_TIMEOUT_MS = 10_000; // a send may retry a goal's delivery for up to 8 s (§8)
const CALL_TIMEOUT_MS = 30_000; // §9: the correlator's default
const ERROR_TEXT_MAX = 1024; // §9: an error answer's `message`
/** The task states nothing changes again (§10). */
const TERMINAL_TASK_STATES = ['completed', 'failed', 'rejected', 'canceled'];

/** What `Agent.connect` takes besides the URL and the id. How it signs in, as NATS users do
 * (at most one of `creds` and `nkeySeed`; either replaces the context's credentials):
 * - `creds`: path to a NATS credentials file (`.creds`, a user JWT and its seed);
 * - `nkeySeed`: path to an NKey seed file (`switchboard nats-config` writes
 *   `agents/<id>.nk`), or the seed itself (`SU…`);
 * - `context`: a NATS CLI context by name, `$XDG_CONFIG_HOME/nats/context/<name>.json`
 *   (default `~/.config/nats/context/`): its `url` (when `connect` is given no URL), its
 *   credentials (`creds`, `nkey`, `user` and `password`, or `token`) and TLS files (`ca`,
 *   `cert`, `key`). */
export interface ConnectOptions extends SignIn {
  description?: string;
  capabilities?: string[];
  /** More card fields (§5): skills, ACLs, max_concurrent_tasks, metadata. */
  card?: Partial<AgentCard>;
  goalKind?: 'interactive' | 'background' | 'daemon';
  /** The goal's name (§4.4; 1–64 characters of [a-z0-9_.-]), default `"main"`. The directory
   * derives the goal id from (agent id, name), so the same name always opens the same goal:
   * an agent that restarts (crashed, killed, or `close({keepGoal: true})`) gets its goal back
   * with what was sent meanwhile, and `lookup` still shows one live goal. Two processes of one
   * agent with the same name share one goal, and read the same messages: give each its own
   * name (`worker-1`, `worker-2`). `null`: a fresh, unnamed goal each time. */
  goal?: string | null;
  /** Re-open this goal by id instead of by name (an unnamed goal this agent held before a
   * restart; a named goal is re-opened by its name, its id is refused here). */
  goalId?: string;
  openGoal?: boolean;
  requestTimeoutMs?: number;
}

function traceHeaders(trace?: Trace): MsgHdrs | undefined {
  if (!trace?.traceparent) return undefined;
  const h = headers();
  h.set('traceparent', trace.traceparent);
  if (trace.tracestate) h.set('tracestate', trace.tracestate);
  return h;
}

/** A reply's body, or the error of its error reply (§2). */
/** @internal A reply's body, or its error reply thrown (§2). */
export function decodeReply<T>(subject: string, msg: Msg): T {
  return decode<T>(subject, msg);
}

function decode<T>(subject: string, msg: Msg): T {
  // A status message with no body: nobody serves the subject (a reply subject of a stream).
  if (!msg.data.length && msg.headers?.code === 503) {
    throw new Unavailable('no_responders', 503, `no service answers on ${subject}`);
  }
  let data: unknown;
  try {
    data = msg.data.length ? msg.json() : {};
  } catch {
    throw errorFor('internal', 502, `the reply on ${subject} is not JSON`);
  }
  const code = msg.headers?.get('Nats-Service-Error-Code');
  // An error reply (§2) has the header and a body of only `error`; a call's answer may carry an
  // `error` of the callee's (§9) next to its correlation id: that is an answer, not a refusal.
  const refusal = data && typeof data === 'object' && 'error' in data
    && !('correlation_id' in data);
  if (data && typeof data === 'object' && (refusal || code)) {
    const err = ((data as Json).error ?? {}) as Json;
    throw errorFor(String(err.kind ?? 'unknown'), Number(err.code ?? code ?? 500),
      String(err.message ?? msg.headers?.get('Nats-Service-Error') ?? ''));
  }
  return data as T;
}

/** What `serve` runs for each message. */
export type Handler = (message: Message) => unknown | Promise<unknown>;

/** Options of `serve`. */
export interface ServeOptions {
  /** How many handlers run at once (default 1: one message at a time, in order). */
  maxConcurrent?: number;
  /** Signals that stop the agent gracefully (default SIGTERM and SIGINT; `[]`: none). A
   * second one while stopping ends the process at once. */
  stopSignals?: NodeJS.Signals[];
  /** The goal to read (default: the agent's goal). */
  goalId?: string;
  /** Messages fetched at once (default 16, at least `maxConcurrent`). */
  batch?: number;
  /** How long a fetch waits for a message (default 1000 ms). */
  waitMs?: number;
  /** Told about each handler that threw (default: `console.error`). */
  onError?: (error: unknown, message: Message) => void;
}

/** `text` cut to `max` characters (code points, as the services count them). */
function cut(text: string, max = ERROR_TEXT_MAX): string {
  if (text.length <= max) return text;
  const chars = Array.from(text);
  return chars.length > max ? chars.slice(0, max).join('') : text;
}

/** The text of a thrown value, at most `max` characters. */
function errorText(err: unknown, max = ERROR_TEXT_MAX): string {
  let text: string;
  if (err instanceof Error) text = err.message || err.name;
  else {
    try {
      text = typeof err === 'string' ? err : JSON.stringify(err) ?? String(err);
    } catch {
      text = String(err);
    }
  }
  return cut(text || 'the handler failed', max);
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** One agent: its NATS connection, its card, its current goal. Build it with `connect`. */
export class Agent {
  goalId: string | undefined;
  /** The name the current goal was opened by (§4.4), if any. */
  goalName: string | undefined;
  private beats: NodeJS.Timeout | undefined;
  private toolbox: Toolbox | undefined;
  private closed = false;
  /** Per goal, the highest sequence this agent acknowledged: hand-out is at least once (§7),
   * so a message at or below it that comes again is a repeat, dropped. */
  private readonly acked = new Map<string, number>();
  private closing: Promise<void> | undefined;
  private server: Server | undefined;

  private constructor(readonly nc: NatsConnection, readonly id: string,
    readonly requestTimeoutMs: number) {}

  /** Connects as `agentId`, registers its card (§4.1), opens a goal (§4.4) and heartbeats
   * every 10 s. Replies arrive under `_INBOX.<agentId>`, the only inboxes the generated NATS
   * accounts let an agent read. `natsUrl` may be `undefined` (or `null`) when
   * `options.context` names a NATS CLI context with a `url`; with neither, the context
   * `$NATS_CONTEXT` names is used (when it is set). Throws before connecting when a
   * credentials, seed or context file is missing or malformed (the message names the file).
   * Call `close()` when the agent stops. */
  static async connect(natsUrl: string | string[] | null | undefined, agentId: string,
    options: ConnectOptions = {}): Promise<Agent> {
    const nc = await connect({
      ...signIn(natsUrl, options),
      name: `switchboard-ts-${agentId}`,
      inboxPrefix: `_INBOX.${agentId}`,
    });
    const agent = new Agent(nc, agentId, options.requestTimeoutMs ?? REQUEST_TIMEOUT_MS);
    try {
      await agent.request(`agent.registry.register.${agentId}`, {
        description: options.description ?? '',
        capabilities: options.capabilities ?? [],
        ...options.card,
      });
      if (options.openGoal ?? true) {
        await agent.openGoal({ kind: options.goalKind ?? 'daemon', goalId: options.goalId,
          name: options.goalId ? undefined : options.goal === undefined ? 'main'
            : options.goal ?? undefined });
      }
    } catch (err) {
      await nc.close();
      throw err;
    }
    agent.beats = setInterval(() => {
      agent.request(`agent.registry.heartbeat.${agentId}`, {}).catch(() => undefined);
    }, HEARTBEAT_EVERY_MS);
    return agent;
  }

  /** Stops gracefully: when `serve` runs, it stops taking messages and the handlers in
   * progress finish and are acknowledged first; then closes the current goal (its inbox is
   * purged, §4.5), deregisters (§4.3) and disconnects. With `keepGoal`, only disconnects (after
   * the handlers in progress): the goal keeps its messages for a restart (`connect` with the
   * same `goal` name), and the directory marks the agent offline 30 s later. Called from
   * inside a handler, it returns at once and the stop completes once the handler returns. */
  close(opts: { keepGoal?: boolean } = {}): Promise<void> {
    this.closing ??= this.shutDown(opts);
    if (this.server && handlerScope.getStore() === this.server) return Promise.resolve();
    return this.closing;
  }

  private async shutDown(opts: { keepGoal?: boolean }): Promise<void> {
    if (this.server) await this.server.drain();
    this.closed = true;
    clearInterval(this.beats);
    if (!opts.keepGoal) {
      try {
        if (this.goalId) await this.closeGoal(this.goalId);
        await this.request(`agent.registry.deregister.${this.id}`, {});
      } catch {
        // Leaving anyway.
      }
    }
    await this.nc.close();
  }

  /** The graceful stop (what SIGTERM does to `serve`): the same as `close()`. */
  stop(): Promise<void> {
    return this.close();
  }

  /** The fabric as tools for an LLM (function calling), bound to this agent: `.openai()` and
   * `.anthropic()` give the definitions, `.run(call)` / `.runAll(calls)` run a model's tool
   * calls and give back results in the model's format. One `Toolbox` per agent (it keeps what
   * `check_inbox` showed, for `reply_to_peer`); `new Toolbox(agent, options)` makes another. */
  get tools(): Toolbox {
    this.toolbox ??= new Toolbox(this);
    return this.toolbox;
  }

  /** Whether `close` was called. */
  get isClosed(): boolean {
    return this.closed || this.closing !== undefined;
  }

  /** One request to a service (§1): the reply, or the error reply's error (§2). */
  async request<T = Json>(subject: string, body: unknown,
    opts: { trace?: Trace; timeoutMs?: number } = {}): Promise<T> {
    try {
      const msg = await this.nc.request(subject, JSON.stringify(body), {
        timeout: opts.timeoutMs ?? this.requestTimeoutMs,
        headers: traceHeaders(opts.trace),
      });
      return decode<T>(subject, msg);
    } catch (err) {
      if (err instanceof RequestError && err.isNoResponders()) {
        throw new Unavailable('no_responders', 503, `no service answers on ${subject}`);
      }
      if (err instanceof TimeoutError || (err as Error).name === 'TimeoutError') {
        throw new Unavailable('request_timeout', 504, `no reply on ${subject} in time`);
      }
      throw err;
    }
  }

  // ------------------------------------------------------------------- the directory
  /** Opens a goal, an inbox of its own (§4.4); it becomes the current goal. By `name`: the
   * same name always opens the same goal (re-opened with what it holds); by `goalId`: that
   * goal; neither: a fresh one. */
  async openGoal(opts: { name?: string; goalId?: string; kind?: string; overflow?: string } = {}):
    Promise<string> {
    const body: Json = { kind: opts.kind ?? 'daemon' };
    if (opts.goalId) body.goal_id = opts.goalId;
    else if (opts.name) body.name = opts.name;
    if (opts.overflow) body.overflow = opts.overflow;
    const reply = await this.request<{ goal_id: string }>(`agent.registry.goal.open.${this.id}`, body);
    this.goalId = reply.goal_id;
    this.goalName = opts.goalId ? undefined : opts.name;
    return reply.goal_id;
  }

  /** Closes a goal and purges its inbox (§4.5). */
  async closeGoal(goalId: string): Promise<GoalCloseReply> {
    const reply = await this.request<GoalCloseReply>(`agent.registry.goal.close.${this.id}`, { goal_id: goalId });
    if (goalId === this.goalId) this.goalId = this.goalName = undefined;
    return reply;
  }

  /** The agents this one may reach, with cards and status (§4.6): whom an LLM may ask.
   * Every page, unless `limit` asks for one page of that size. */
  async listPeers(opts: { limit?: number; after?: string; skill?: string } = {}):
    Promise<PeersReply['peers']> {
    const peers: PeersReply['peers'] = [];
    let after = opts.after;
    for (;;) {
      const page = await this.peersPage({ ...opts, after });
      peers.push(...page.peers);
      if (opts.limit !== undefined || !page.next) return peers;
      after = page.next;
    }
  }

  /** One page of peers (§4.6), in id order: `peers`, and `next` (the `after` of the next page)
   * when there are more. `skill`: only agents whose card lists it. */
  async peersPage(opts: { limit?: number; after?: string; skill?: string } = {}):
    Promise<PeersReply> {
    const body: Json = {};
    if (opts.after !== undefined) body.after = opts.after;
    if (opts.limit !== undefined) body.limit = opts.limit;
    if (opts.skill !== undefined) body.skill = opts.skill;
    return this.request<PeersReply>(`agent.registry.peers.${this.id}`, body);
  }

  /** One agent's card, status and live goals (§4.7). */
  async lookup(agentId: string): Promise<LookupReply> {
    return this.request<LookupReply>(`agent.registry.lookup.${this.id}`, { agent_id: agentId });
  }

  // ------------------------------------------------------------------- the inbox
  /** The goal's inbox as it fills (§7), fetched in batches held up to `waitMs`, one message at
   * a time. A message is acknowledged when the loop asks for the next one, after your loop
   * body is done with it (at least once); call `message.ack()` before a `break`. If the loop
   * body throws, that message is not acknowledged (the next reader gets it again) and the goal
   * stays open: only `close()` closes it. `serve` does the same with error answers, rejects,
   * concurrency and graceful stops. Ends when the agent closes. */
  async *messages(opts: { goalId?: string; batch?: number; waitMs?: number } = {}):
    AsyncGenerator<Message> {
    const goal = opts.goalId ?? this.goalId;
    if (!goal) throw new Error('no goal: open one first');
    const waitMs = opts.waitMs ?? 1000;
    while (!this.isClosed) {
      let page: FetchReply;
      try {
        page = await this.fetchPage({ goal_id: goal, max: opts.batch ?? 16, wait_ms: waitMs });
      } catch (err) {
        if (this.isClosed) return; // closed while a fetch was held: the loop just ends
        throw err;
      }
      for (const entry of page.messages) {
        if (this.isRepeat(goal, entry.seq)) continue;
        const message = new Message(this, goal, entry);
        yield message;
        await message.ack();
      }
    }
  }

  /** Runs `handler` on every message of the goal until the agent stops: the agent's main
   * loop. Up to `maxConcurrent` handlers run at once; acknowledgements stay cumulative (a
   * message is acknowledged once it and every message before it are done), so a crash loses
   * nothing: what was not acknowledged is read again after a restart.
   *
   * A handler that throws loses nothing either, and the loop goes on with the next message:
   * a call is answered at once with an error (`error: {kind: "handler_error", message: <the
   * error's text>}`, which the caller gets as `CallFailed`); a task (`kind: task`) is ended
   * for its requester with the error's text as the reason (`rejected` while still
   * `submitted`, `failed` once this goal accepted it, started first if need be; left alone if
   * it ended already) and its message acknowledged; any other message, and a task that cannot
   * be ended (gone, held by another goal, refused), is rejected (§7, `ack` with `reject`: it
   * goes to the dead letters with the error's text as the reason, where an operator can
   * `switchboard dlq replay` it).
   *
   * On SIGTERM or SIGINT (`stopSignals`), or `close()`, it stops gracefully: it takes no new
   * message, lets the handlers in progress finish and acknowledges them, then closes the goal,
   * deregisters and disconnects; then the promise resolves. An idle loop does not wait out its
   * held read (`waitMs`): the read is dropped at once. Do not `await agent.close()` and
   * `await agent.serve()` from one function at once before the loop returns: call close from a
   * handler or a signal. */
  async serve(handler: Handler, opts: ServeOptions = {}): Promise<void> {
    if (this.server) throw new Error('this agent is serving already');
    if (this.isClosed) throw new Error('this agent is closed');
    const goal = opts.goalId ?? this.goalId;
    if (!goal) throw new Error('no goal: open one first');
    const server = new Server(this, goal, handler, opts);
    this.server = server;
    const signals = opts.stopSignals ?? ['SIGTERM', 'SIGINT'];
    let stopping = false;
    const onSignal = (signal: NodeJS.Signals) => {
      if (stopping) {
        // A second signal: stop waiting. Without our listeners the signal's default ends us.
        for (const s of signals) process.removeListener(s, onSignal);
        process.kill(process.pid, signal);
        return;
      }
      stopping = true;
      void this.close().catch(() => undefined);
    };
    for (const signal of signals) process.on(signal, onSignal);
    try {
      await server.run();
    } finally {
      for (const signal of signals) process.removeListener(signal, onSignal);
      if (!this.closing) this.server = undefined; // failed: another serve may start
    }
    // The loop ended for a stop: the goal closes (or is kept) once the handlers are done.
    if (this.closing) await this.closing;
  }

  // ------------------------------------------------------------------- messages
  /** send_to_peer (§8): into every live goal of `to`; the delivery report. Use it to tell,
   * not to ask (`call` waits). `receipt` asks for delivered/read receipts; `inReplyTo`
   * threads it (a message, which also passes on its hop budget, or a message id);
   * `correlationId` is carried to the receiver unchanged.
   *
   * A `to` of a person or a role (`'person:alice'`, `'role:oncall'`) is not an agent: the text
   * goes to them as a note instead (`notePerson`, with `metadata`, and `messageId` as its note
   * id), and the promise resolves to its `NoteReport` (`item_id`, `to`) — also when `to` is
   * typed as a plain `string` (check `'item_id' in report`, or call `notePerson`). A note
   * carries no `parts`, `receipt` or `correlationId` (a `TypeError`). */
  send(to: PartyId, text: string, opts?: SendOptions): Promise<NoteReport>;
  send(to: string, text: string, opts?: SendOptions): Promise<DeliveryReport>;
  async send(to: string, text: string, opts: SendOptions = {}):
    Promise<DeliveryReport | NoteReport> {
    if (isParty(to)) {
      if (opts.parts?.length || opts.receipt || opts.correlationId || opts.attachments?.length) {
        throw new TypeError(`a note to ${to} carries only text and metadata: no parts, receipt `
          + 'or correlationId');
      }
      return this.notePerson(to, text, { metadata: opts.metadata, noteId: opts.messageId });
    }
    const body: Json = { to, message: text, id: opts.messageId ?? crypto.randomUUID() };
    if (this.goalId) body.from_goal_id = this.goalId;
    if (opts.parts?.length) body.parts = opts.parts;
    if (opts.metadata) body.metadata = opts.metadata;
    if (opts.receipt) body.receipt = opts.receipt;
    if (opts.correlationId) body.correlation_id = opts.correlationId;
    if (opts.attachments?.length) body.attachments = opts.attachments;
    const inReplyTo = typeof opts.inReplyTo === 'string' ? undefined : opts.inReplyTo;
    if (typeof opts.inReplyTo === 'string') body.in_reply_to = opts.inReplyTo;
    if (inReplyTo) {
      body.in_reply_to = inReplyTo.id;
      if (inReplyTo.raw.ttl !== undefined) body.ttl = inReplyTo.raw.ttl;
    }
    return this.request<DeliveryReport>(`agent.send.${this.id}`, body,
      { trace: inReplyTo?.trace });
  }

  // ------------------------------------------------------------------- files (§17)
  /** Uploads the file at `path` (its name is the path's last part) and returns its
   * attachment, `{name, media_type, size, sha256, ref}`, to put on a send (`attachments`).
   * Any size up to the service's limit (1 GiB by default); the service checks the digest.
   * `BadRequest` (`file_too_large`, a bad name or media type, `quota_exceeded`) before any
   * data moves. */
  async uploadFile(path: string, mediaType = 'application/octet-stream'): Promise<Attachment> {
    return files.uploadFile(this, path, mediaType);
  }

  /** Uploads `data` as a file named `name`; returns its attachment. */
  async uploadBytes(name: string, mediaType: string, data: Uint8Array): Promise<Attachment> {
    return files.uploadBytes(this, name, mediaType, data);
  }

  /** The whole file of an attachment delivered to you (or one you uploaded), its size and
   * SHA-256 checked. `NotFound` when it is not yours to read. */
  async readAttachment(attachment: Attachment): Promise<Uint8Array> {
    return files.readAttachment(this, attachment);
  }

  /** Saves an attachment's file at `path` (whole, or nothing); returns its size. Never use
   * `attachment.name` as a path of its own: join it to a folder you chose. */
  async saveAttachment(attachment: Attachment, path: string): Promise<number> {
    return files.saveAttachment(this, attachment, path);
  }

  /** Deletes a file you uploaded, now; its readers lose it too. */
  async deleteFile(fileId: string): Promise<boolean> {
    const reply = await this.request<{ deleted: boolean }>(`agent.files.delete.${this.id}`,
      { file_id: fileId });
    return reply.deleted;
  }

  /** Takes back one reader of your file (`agentId`), or every one; returns how many. */
  async revokeFile(fileId: string, agentId?: string): Promise<number> {
    const body: Json = { file_id: fileId };
    if (agentId) body.agent_id = agentId;
    const reply = await this.request<{ revoked: number }>(`agent.files.revoke.${this.id}`, body);
    return reply.revoked;
  }

  /** A message to every agent this one may reach (§8, `to: "*"`). */
  async broadcast(text: string, opts: SendOptions = {}): Promise<DeliveryReport> {
    return this.send('*', text, opts);
  }

  /** One message, acknowledged at once (`undefined` when none came within `waitMs`): for a
   * script waiting for one answer. It shares the goal's cursor with `messages()`: do not use
   * both on one goal at once. */
  async nextMessage(opts: { goalId?: string; waitMs?: number } = {}): Promise<Message | undefined> {
    const goal = opts.goalId ?? this.goalId;
    const waitMs = opts.waitMs ?? 5000;
    const page = await this.fetchPage({ goal_id: goal, max: 1, wait_ms: waitMs });
    for (const entry of page.messages) {
      if (this.isRepeat(goal!, entry.seq)) continue;
      const message = new Message(this, goal!, entry);
      await message.ack();
      return message;
    }
    return undefined;
  }

  /** Whether the message at `seq` of `goal` was acknowledged already (handed out again). */
  private isRepeat(goal: string, seq: number): boolean {
    return seq <= (this.acked.get(goal) ?? 0);
  }

  /** @internal An ack (§7), sent again while no inbox service answers: acks are idempotent
   * (through a sequence already passed moves nothing), so a reader whose service replica went
   * away does not hand its message out again for want of one. */
  async ackInbox(body: Json): Promise<void> {
    let pause = 100;
    for (let attempt = 1; ; attempt++) {
      try {
        await this.request(`agent.inbox.ack.${this.id}`, body,
          { timeoutMs: this.inboxAttemptMs });
        return;
      } catch (err) {
        if (!(err instanceof Unavailable) || this.isClosed || attempt >= ACK_ATTEMPTS) throw err;
        await new Promise((r) => setTimeout(r, pause));
        pause *= 2;
      }
    }
  }

  /** @internal How long one fetch (past its wait) or ack waits for its reply:
   * {@link INBOX_ATTEMPT_MS}, or the request timeout if shorter. */
  get inboxAttemptMs(): number {
    return Math.min(INBOX_ATTEMPT_MS, this.requestTimeoutMs);
  }

  /** @internal A fetch (§7), sent again while no inbox service answers. One held by a replica
   * that went away gets no reply: after its `wait_ms` and {@link INBOX_ATTEMPT_MS} more it is
   * sent again, without waiting, so a stopped replica costs the reader about two seconds, not
   * the request timeout. Never two copies at once: each copy that reaches a replica counts as
   * a hand-out of the oldest unread message towards its redelivery limit. */
  async fetchPage(body: Json): Promise<FetchReply> {
    let pause = 100;
    for (let attempt = 1; ; attempt++) {
      const waitMs = typeof body.wait_ms === 'number' ? body.wait_ms : 0;
      try {
        return await this.request<FetchReply>(`agent.inbox.fetch.${this.id}`, body,
          { timeoutMs: this.inboxAttemptMs + waitMs });
      } catch (err) {
        if (!(err instanceof Unavailable) || this.isClosed || attempt >= FETCH_ATTEMPTS) throw err;
        body = { ...body, wait_ms: 0 };
        await new Promise((r) => setTimeout(r, pause));
        pause *= 2;
      }
    }
  }

  /** @internal Records an acknowledgement (cumulative) of `goal` through `seq`. */
  doneThrough(goal: string, seq: number): void {
    if (seq > (this.acked.get(goal) ?? 0)) this.acked.set(goal, seq);
  }

  /** Where a message sent with a receipt is, per goal (§8, Receipts). */
  async sendStatus(messageId: string): Promise<SendStatusReply> {
    return this.request<SendStatusReply>(`agent.send.status.${this.id}`, { message_id: messageId });
  }

  // ------------------------------------------------------------------- calls
  private callBody(to: string, text: string, opts: CallOptions): Json {
    const body: Json = { to, message: text, timeout_ms: opts.timeoutMs ?? CALL_TIMEOUT_MS,
      correlation_id: opts.correlationId ?? callId() };
    if (this.goalId) body.from_goal_id = this.goalId;
    if (opts.parts?.length) body.parts = opts.parts;
    if (opts.metadata) body.metadata = opts.metadata;
    if (opts.receipt) body.receipt = opts.receipt;
    if (opts.serving) {
      if (opts.serving.correlationId) body.parent_correlation_id = opts.serving.correlationId;
      body.in_reply_to = opts.serving.id;
    }
    if (opts.budget) body.budget = budgetAsk(opts.budget);
    if (opts.attachments?.length) body.attachments = opts.attachments;
    return body;
  }

  /** Asks `to` and waits for the answer (§9): a `CallAnswer`, its text in `body`. `serving`
   * is the call being answered while this one is made (its deadline bounds this one). Throws
   * `CallTimeout` when no answer came in time, `CallFailed` when the callee answered with an
   * error (its handler threw, or it called `replyError`). */
  async call(to: string, text: string, opts: CallOptions = {}): Promise<CallAnswer> {
    const body = this.callBody(to, text, opts);
    const answer = await this.request<CallAnswer>(`agent.call.${this.id}`, body, {
      trace: opts.serving?.trace,
      timeoutMs: Number(body.timeout_ms) + this.requestTimeoutMs,
    });
    const failed = CallFailed.fromAnswer(answer as unknown as Json);
    if (failed) throw failed;
    return answer;
  }

  /** Asks without waiting (§9, `wait: false`): the answer lands in this goal's inbox as a
   * `kind: response` message (`correlationId` = this call's; a streamed answer's parts first,
   * `message.part` 1, 2, …); an error answer has `message.error` set
   * (`message.raiseForError()` throws it as `CallFailed`). */
  async callParked(to: string, text: string, opts: CallOptions = {}): Promise<CallParked> {
    const body: Json = { ...this.callBody(to, text, opts), wait: false };
    return this.request<CallParked>(`agent.call.${this.id}`, body, { trace: opts.serving?.trace });
  }

  /** Asks and yields the answer as it comes (§9, "Streamed answers"): each part as a
   * `CallPart` (`partial: true`, `part` 1, 2, 3… in order with no gap, `body` that part's
   * text), then the final `CallAnswer` (`body` every part's text joined with the final
   * reply's, `streamed` how many parts came before it) — always last, and only once; tell
   * them apart by `'partial' in event`. Throws `CallTimeout` past the deadline (after reading
   * back what the call has, in case the answer itself was lost), `CallFailed` (after the parts)
   * when the callee ended it with an error. */
  async *callStream(to: string, text: string, opts: CallOptions = {}):
    AsyncGenerator<CallPart | CallAnswer> {
    const body: Json = { ...this.callBody(to, text, opts), stream: true };
    const inbox = createInbox(`_INBOX.${this.id}`);
    const sub = this.nc.subscribe(inbox);
    const replies = sub[Symbol.asyncIterator]();
    const deadline = Date.now() + Number(body.timeout_ms) + this.requestTimeoutMs;
    let next = 1;
    const readBack = async (): Promise<{ parts: CallPart[]; answer?: CallAnswer }> => {
      const back = await this.request<CallParts>(`agent.calls.parts.${this.id}`,
        { correlation_id: body.correlation_id, after: next - 1 });
      const parts = back.parts.filter((part) => part.part >= next)
        .sort((x, y) => x.part - y.part);
      const taken: CallPart[] = [];
      for (const part of parts) {
        if (part.part !== next) break;
        next += 1;
        taken.push(part);
      }
      return { parts: taken, answer: back.answer ?? undefined };
    };
    try {
      this.nc.publish(`agent.call.${this.id}`, JSON.stringify(body),
        { reply: inbox, headers: traceHeaders(opts.serving?.trace) });
      for (;;) {
        let timer: NodeJS.Timeout | undefined;
        const expired = new Promise<'expired'>((resolve) => {
          timer = setTimeout(() => resolve('expired'), Math.max(deadline - Date.now(), 1));
        });
        const got = await Promise.race([replies.next(), expired]);
        clearTimeout(timer);
        if (got === 'expired' || got.done) {
          const back = await readBack();
          yield* back.parts;
          if (back.answer) {
            const failed = CallFailed.fromAnswer(back.answer as unknown as Json);
            if (failed) throw failed;
            yield back.answer;
            return;
          }
          throw errorFor('timeout', 504, `no answer from \`${to}\` within ${body.timeout_ms} ms`);
        }
        const reply = decode<Json>(`agent.call.${this.id}`, got.value);
        if (reply.partial) {
          const part = reply as unknown as CallPart;
          if (part.part > next) yield* (await readBack()).parts;
          if (part.part === next) {
            next += 1;
            yield part;
          }
          continue;
        }
        const answer = reply as unknown as CallAnswer;
        if ((answer.streamed ?? 0) >= next) yield* (await readBack()).parts;
        const failed = CallFailed.fromAnswer(reply);
        if (failed) throw failed;
        yield answer;
        return;
      }
    } finally {
      sub.unsubscribe();
    }
  }

  /** This agent's open calls, outgoing and incoming (§9). */
  async pendingCalls(): Promise<PendingCalls> {
    return this.request<PendingCalls>(`agent.calls.pending.${this.id}`, {});
  }

  /** reply_to_peer (§9): answers the call `correlationId`. */
  async reply(correlationId: string, text: string,
    opts: { parts?: Part[]; trace?: Trace; attachments?: Attachment[] } = {}): Promise<ReplyAck> {
    const body: Json = { correlation_id: correlationId, message: text };
    if (opts.parts?.length) body.parts = opts.parts;
    if (opts.attachments?.length) body.attachments = opts.attachments;
    return this.request<ReplyAck>(`agent.reply.${this.id}`, body, { trace: opts.trace });
  }

  /** Part `part` of a streamed answer (§9): numbered from 1, then 2, 3… (a retried number is
   * taken once). Finish with `reply(text)` (its text comes last) or `endStream` (no more
   * text). */
  async replyPart(correlationId: string, part: number, text: string,
    opts: { parts?: Part[]; trace?: Trace; attachments?: Attachment[] } = {}):
    Promise<ReplyAck> {
    const body: Json = { correlation_id: correlationId, message: text, partial: true, part };
    if (opts.parts?.length) body.parts = opts.parts;
    if (opts.attachments?.length) body.attachments = opts.attachments;
    return this.request<ReplyAck>(`agent.reply.${this.id}`, body, { trace: opts.trace });
  }

  /** Ends a streamed answer with no more text (§9: a final reply after parts may be empty):
   * the caller's final answer is the parts' text joined. */
  async endStream(correlationId: string, opts: { trace?: Trace } = {}): Promise<ReplyAck> {
    return this.reply(correlationId, '', opts);
  }

  /** Answers the call `correlationId` with an error instead of an answer (§9, `error` on a
   * final reply): the caller gets `CallFailed` with this `kind` (1–64 characters of
   * [a-z0-9_]) and `text` (cut to 1024 characters). It ends a stream too. */
  async replyError(correlationId: string, kind: string, text: string,
    opts: { trace?: Trace } = {}): Promise<ReplyAck> {
    const error: CallError = { kind, message: cut(text) };
    return this.request<ReplyAck>(`agent.reply.${this.id}`,
      { correlation_id: correlationId, message: '', error }, { trace: opts.trace });
  }

  // ------------------------------------------------------------------- tasks
  /** Hands `to` work with a state, followed to its end (§10): for work that takes long, may
   * ask questions or splits into subtasks. Updates come to this goal. */
  async createTask(to: string, text: string, opts: TaskOptions = {}): Promise<TaskHandle> {
    return new TaskHandle(this, (await this.createTaskReply(to, text, opts)).task);
  }

  /** A subtask of the task this agent works on (§10); `to: "self"` keeps it. */
  async spawn(parentTaskId: string, to: string, text: string, opts: TaskOptions = {}):
    Promise<TaskHandle> {
    return new TaskHandle(this, (await this.createTaskReply(to, text, opts, parentTaskId)).task);
  }

  /** @internal `createTask` (or, with `parentTaskId`, `spawn`): the whole reply, with
   * `delivered_to` and `deadline_clamped`. */
  async createTaskReply(to: string, text: string, opts: TaskOptions = {}, parentTaskId?: string):
    Promise<TaskReply> {
    if (parentTaskId === undefined) {
      return this.request<TaskReply>(`agent.task.create.${this.id}`, this.taskBody(to, text, opts));
    }
    return this.request<TaskReply>(`agent.task.spawn.${this.id}`,
      { ...this.taskBody(to, text, opts), parent_task_id: parentTaskId });
  }

  private taskBody(to: string, text: string, opts: TaskOptions): Json {
    const body: Json = { to, message: text, task_id: opts.taskId ?? crypto.randomUUID() };
    if (this.goalId) body.from_goal_id = this.goalId;
    if (opts.parts?.length) body.parts = opts.parts;
    if (opts.deadlineInMs !== undefined) body.deadline_in_ms = opts.deadlineInMs;
    if (opts.metadata) body.metadata = opts.metadata;
    if (opts.inReplyTo) body.in_reply_to = opts.inReplyTo.id;
    if (opts.receipt) body.receipt = opts.receipt;
    if (opts.budget) body.budget = budgetAsk(opts.budget);
    if (opts.attachments?.length) body.attachments = opts.attachments;
    return body;
  }

  /** Cancels a task this agent gave, and its open subtasks (§10). */
  async cancelTask(taskId: string, reason?: string): Promise<TaskRecord> {
    return this.taskOp('cancel', taskId, reason);
  }

  /** One transition (§10): accept, reject, start, progress, input_required, complete,
   * fail, cancel; the task after it. `attachments`: files for the other party (§17); a
   * completion's are the task's `result_attachments`. */
  async taskOp(op: string, taskId: string, text?: string,
    opts: TaskOpOptions = {}): Promise<TaskRecord> {
    return (await this.taskOpReply(op, taskId, text, opts)).task;
  }

  /** @internal `taskOp`: the whole reply, with `duplicate` and (a cancel's) `descendants`. */
  async taskOpReply(op: string, taskId: string, text?: string,
    opts: TaskOpOptions = {}): Promise<TaskReply> {
    const body: Json = { task_id: taskId };
    if (text !== undefined) body.message = text;
    if (opts.parts?.length) body.parts = opts.parts;
    if (opts.attachments?.length) body.attachments = opts.attachments;
    if (op === 'accept' && this.goalId) body.from_goal_id = this.goalId;
    return this.request<TaskReply>(`agent.task.${op}.${this.id}`, body, { trace: opts.trace });
  }

  /** A task this agent is a party of (§10). */
  async getTask(taskId: string): Promise<TaskRecord> {
    return (await this.request<TaskReply>(`agent.task.get.${this.id}`, { task_id: taskId })).task;
  }

  /** This agent's tasks (§10): role, state, parent, peer, limit, cursor, newest_first. */
  async listTasks(filters: Json = {}): Promise<TaskList> {
    return this.request<TaskList>(`agent.task.list.${this.id}`, filters);
  }

  // ------------------------------------------------------------------- people
  private peopleRequest<T>(op: string, body: unknown): Promise<T> {
    return this.request<T>(`agent.people.${op}.${this.id}`, body);
  }

  private answerGoal(goalId: string | undefined): string {
    const goal = goalId ?? this.goalId;
    if (!goal) throw new Error('no goal: open one first (the answer comes to a goal\'s inbox)');
    return goal;
  }

  /** The persons and roles of the people file (§14, `list`): `people` (`{id: "person:alice",
   * name, roles, approver, reachable}`: `approver` whether they may decide approvals,
   * `reachable` whether this agent may address them) and `roles` (`{id: "role:oncall",
   * members, reachable}`). Look here before asking. */
  async people(): Promise<PeopleList> {
    return this.peopleRequest<PeopleList>('list', {});
  }

  /** Tells a person or a role something (`'person:alice'`, `'role:oncall'`; §14, `note`): it
   * waits, unread, in their inbox; nothing comes back when they read it. The note's id
   * (`noteId`) is chosen here, so a retry with the same one is noted once. To get an answer,
   * `askPerson`. `send(to, text)` with such a `to` does the same. */
  async notePerson(to: string, text: string, opts: { metadata?: Json; noteId?: string } = {}):
    Promise<NoteReport> {
    const body: Json = { to, message: text, note_id: opts.noteId ?? crypto.randomUUID() };
    if (opts.metadata) body.metadata = opts.metadata;
    return this.peopleRequest<NoteReport>('note', body);
  }

  /** Asks a person, or a role (its first member to answer answers; §14, `ask`), and resolves
   * at once to a `Parked` (`item_id`, `to`, `deadline`, `escalate_at`). The answer comes later
   * to the goal (`goalId`, by default the current one) as one message, `kind: 'response'` from
   * `people` with `correlationId` = `item_id` and `m.fromPerson` the person; or, when nobody
   * answered within `timeoutMs` (default one hour, at most seven days), a `kind: 'notify'`
   * timeout notice. `m.personAnswer(parked.item_id)` tells them from the rest of the goal's
   * mail. `escalateAfterMs` with `escalateTo`: unanswered that long, the question goes to
   * `escalateTo` too, once (a notice says so; it is not the ending). The ask's id (`askId`) is
   * chosen here: after `Unavailable`, ask again with the same one and the retry joins the first
   * (`joined`) instead of asking twice. */
  async askPerson(to: string, question: string, opts: AskPersonOptions = {}): Promise<Parked> {
    const body: Json = { to, message: question, from_goal_id: this.answerGoal(opts.goalId),
      ask_id: opts.askId ?? crypto.randomUUID() };
    if (opts.timeoutMs !== undefined) body.timeout_ms = opts.timeoutMs;
    if (opts.escalateAfterMs !== undefined) body.escalate_after_ms = opts.escalateAfterMs;
    if (opts.escalateTo !== undefined) body.escalate_to = opts.escalateTo;
    if (opts.metadata) body.metadata = opts.metadata;
    return this.peopleRequest<Parked>('ask', body);
  }

  /** Asks a person with approver access (or a role with one among its members) to approve one
   * exact action before the agent does it (§14, "Approvals"): `tool` and its `args` (any JSON;
   * an integer beyond ±(2^53 − 1) is refused: send it as a string), with `reason` shown to the
   * person. Resolves at once to a `Parked` whose `action_hash` binds the approval to that
   * action (SHA-256 of its RFC 8785 JSON: key order does not matter, any other change does).
   * The decision comes to the goal as `askPerson`'s answer does (`m.approved` says which), or a
   * timeout notice when nobody decided within `expiresInMs`, which is also how long the
   * approval may be used. When approved, `useApproval` right before acting. The id
   * (`approvalId`) is chosen here, so a retry with it joins the first request. */
  async requestApproval(tool: string, args: unknown, reason: string, to: string,
    expiresInMs: number, opts: RequestApprovalOptions = {}): Promise<Parked> {
    const body: Json = { action: { tool, arguments: args }, reason, to,
      from_goal_id: this.answerGoal(opts.goalId), expires_in_ms: expiresInMs,
      approval_id: opts.approvalId ?? crypto.randomUUID() };
    if (opts.escalateAfterMs !== undefined) body.escalate_after_ms = opts.escalateAfterMs;
    if (opts.escalateTo !== undefined) body.escalate_to = opts.escalateTo;
    return this.peopleRequest<Parked>('approval.request', body);
  }

  /** Spends approval `approvalId` on the action about to be done (§14, "Use"): act only when it
   * resolves (`decided_by`, `decided_at`, `note`, `used_at`). Refused — do not act — with
   * `Conflict` `action_mismatch` when `tool` or `args` differ from what was approved,
   * `approval_pending` before the decision, `approval_used` when it was used already (each
   * approval is good for one use); `AccessDenied` `approval_denied`; `Expired` past its
   * deadline. The `useId` is chosen here: a retry with the same one gets the first use's reply
   * again (`duplicate`). */
  async useApproval(approvalId: string, tool: string, args: unknown,
    opts: { useId?: string } = {}): Promise<ApprovalUsed> {
    return this.peopleRequest<ApprovalUsed>('approval.use', { approval_id: approvalId,
      action: { tool, arguments: args }, use_id: opts.useId ?? crypto.randomUUID() });
  }

  /** One of this agent's notes, asks or approvals as the people service holds it (§14, `get`):
   * `state` (`unread`, `read`, `open`, `escalated`, `answered`, `approved`, `denied`,
   * `expired`, `used`), `answer` (`by`, `message`, `decision`) once a person answered,
   * `deadline`… */
  async personItem(itemId: string): Promise<PersonItem> {
    return this.peopleRequest<PersonItem>('get', { item_id: itemId });
  }

  /** This agent's asks and approvals still waiting for a person, and its approvals approved
   * and not used yet, oldest first (§14, `pending`): `{items}`. */
  async peoplePending(): Promise<PendingItems> {
    return this.peopleRequest<PendingItems>('pending', {});
  }

  // ------------------------------------------------------------------- provider limits
  /** Takes a lease on provider limit `key` (`'openai:gpt-4.1'`; §15, `acquire`) drawing
   * `tokens` (an estimate), waiting up to `waitMs` (at most 60000) in a queue fair across
   * agents: a `Lease`; `Busy` (kind `limited`) when none came in time. Prefer `withLimit`,
   * which gives the lease back for you. */
  async acquireLimit(key: string, opts: LimitOptions = {}): Promise<Lease> {
    const waitMs = opts.waitMs ?? 30_000;
    const body: Json = { key, tokens: opts.tokens ?? 0, wait_ms: waitMs, lease_id: crypto.randomUUID() };
    if (opts.holdMs !== undefined) body.hold_ms = opts.holdMs;
    const lease = await this.request<LeaseReply>(`agent.limits.acquire.${this.id}`, body,
      { timeoutMs: waitMs + this.requestTimeoutMs });
    return new Lease(this, lease);
  }

  /** Runs `fn` holding a lease on provider limit `key`, and gives it back after with the
   * tokens `fn` reported through `lease.used(n)` (else the estimate):
   *
   *     const text = await agent.withLimit('openai:gpt-4.1', { tokens: 1200 }, async (lease) => {
   *       const reply = await llm.chat(...);
   *       lease.used(reply.usage.total_tokens);
   *       return reply.text;
   *     });
   *
   * The fleet never holds more leases than the operator declared for the key. */
  async withLimit<T>(key: string, opts: LimitOptions, fn: (lease: Lease) => Promise<T>):
    Promise<T> {
    const lease = await this.acquireLimit(key, opts);
    try {
      return await fn(lease);
    } finally {
      await lease.release().catch(() => undefined);
    }
  }

  /** Provider limit `key` as declared, what is in use and waiting, and this agent's own leases
   * (§15, `get`). */
  async limitView(key: string): Promise<LimitView> {
    return this.request<LimitView>(`agent.limits.get.${this.id}`, { key });
  }

  // ------------------------------------------------------------------- budgets (§16)
  /** Reports what this agent spent on the work whose budget is `budget` (`msg.budget`):
   * tokens and cost (micro-units: 1_000_000 is $1.00 in USD). Charged up to what the work has
   * left (the rest is `over`); the reply says what is `left`. Not retried: a lost reply may
   * have been charged. */
  async spend(budget: Budget, used: { tokens?: number; cost?: number }): Promise<BudgetView> {
    return this.request<BudgetView>(`agent.budget.spend.${this.id}`, {
      root: budget.root, work: budget.work, tokens: used.tokens ?? 0, cost: used.cost ?? 0,
    });
  }

  /** A budget this agent works under or gave: granted, spent, held by children, left. */
  async budget(budget: Budget): Promise<BudgetView> {
    return this.request<BudgetView>(`agent.budget.get.${this.id}`,
      { root: budget.root, work: budget.work });
  }

  /** What each agent spent in budget tree `root` (the root call's or task's id), or
   * `agentId`'s spend per tree, as the audit recorded it (`agent.audit.cost`). */
  async auditCost(query: { root?: string; agentId?: string }): Promise<CostReport> {
    const body: Json = {};
    if (query.root) body.root = query.root;
    if (query.agentId) body.agent_id = query.agentId;
    return this.request<CostReport>('agent.audit.cost', body);
  }
}

/** A budget as a message carries it (`msg.budget`): its tree and work, and the amounts. */
export interface Budget {
  root: string;
  work: string;
  tokens?: number;
  cost?: number;
}

/** What a call or task asks of budgets (§16): amounts for a new one (or caps on what it draws
 * from the call it serves), or a `Budget` (`msg.budget`) to draw on. */
export type BudgetOption = { tokens?: number; cost?: number } | Budget;

function budgetAsk(option: BudgetOption): Json {
  if ('root' in option && 'work' in option) return { root: option.root, parent: option.work };
  const ask: Json = {};
  if (option.tokens !== undefined) ask.tokens = option.tokens;
  if (option.cost !== undefined) ask.cost = option.cost;
  return ask;
}

/** Options of `acquireLimit` and `withLimit`. */
export interface LimitOptions {
  /** Tokens the provider call is expected to use (drawn from the limit's tokens per minute). */
  tokens?: number;
  /** How long to wait for a lease, in ms (default 30000, at most 60000). */
  waitMs?: number;
  /** How long the lease is held before it returns by itself, in ms (default: the limit's
   * `max_hold_ms`). */
  holdMs?: number;
}

/** A lease on a provider limit (§15). It returns by itself at `expiresAt` unless released or
 * renewed. */
export class Lease {
  readonly leaseId: string;
  readonly key: string;
  readonly tokens: number;
  readonly waitedMs: number;
  expiresAt: string;
  tokensUsed?: number;

  constructor(private readonly agent: Agent, lease: LeaseReply) {
    this.leaseId = lease.lease_id;
    this.key = lease.key;
    this.tokens = lease.tokens;
    this.waitedMs = lease.waited_ms;
    this.expiresAt = lease.expires_at;
  }

  /** Reports the tokens the provider call used; the release corrects the limit's token bucket
   * by the difference from the estimate. */
  used(tokens: number): void {
    this.tokensUsed = tokens;
  }

  /** Gives the lease back (safe to repeat): `released` false when it had expired already. */
  async release(tokensUsed?: number): Promise<Released> {
    const used = tokensUsed ?? this.tokensUsed;
    const body: Json = { key: this.key, lease_id: this.leaseId };
    if (used !== undefined) body.tokens_used = used;
    return this.agent.request<Released>(`agent.limits.release.${this.agent.id}`, body);
  }

  /** Holds the lease `holdMs` more from now (default and most: the limit's `max_hold_ms`). */
  async renew(holdMs?: number): Promise<void> {
    const body: Json = { key: this.key, lease_id: this.leaseId };
    if (holdMs !== undefined) body.hold_ms = holdMs;
    const renewed = await this.agent.request<LeaseReply>(
      `agent.limits.renew.${this.agent.id}`, body);
    this.expiresAt = renewed.expires_at;
  }
}

/** Options of `send`. */
export interface SendOptions {
  parts?: Part[];
  metadata?: Json;
  receipt?: 'delivered' | 'read';
  inReplyTo?: Message | string;
  messageId?: string;
  correlationId?: string;
  /** Files carried by reference (§17, at most 16): each as `uploadFile` returned it, or a
   * message delivered it. Each receiver may then read them. */
  attachments?: Attachment[];
}

/** Options of `askPerson`. */
export interface AskPersonOptions {
  /** How long the person may take (default one hour, at most seven days). */
  timeoutMs?: number;
  /** Unanswered this long, the question goes to `escalateTo` (once; both or neither). */
  escalateAfterMs?: number;
  /** Who gets it then: `person:<id>` or `role:<name>`. */
  escalateTo?: string;
  /** The goal the answer comes to (default: the agent's goal). */
  goalId?: string;
  /** The ask's id (default: a fresh UUID): ask again with it to join the first ask. */
  askId?: string;
  metadata?: Json;
}

/** Options of `requestApproval`. */
export interface RequestApprovalOptions {
  /** Undecided this long, the request goes to `escalateTo` (once; both or neither). */
  escalateAfterMs?: number;
  /** Who gets it then: an approver, `person:<id>` or `role:<name>`. */
  escalateTo?: string;
  /** The goal the decision comes to (default: the agent's goal). */
  goalId?: string;
  /** The approval's id (default: a fresh UUID): request again with it to join the first. */
  approvalId?: string;
}

/** Options of `call`, `callParked` and `callStream`. */
export interface CallOptions {
  timeoutMs?: number;
  parts?: Part[];
  metadata?: Json;
  /** The call being answered while this one is made (§9, the chain and budgets). */
  serving?: Message;
  /** Receipts for the question while the call waits (§8, "Receipts"): `kind: receipt`
   * messages in this goal when the callee's session receives (and reads) it. */
  receipt?: 'delivered' | 'read';
  /** The call's id. Choose it and send the same call again with it after `Unavailable`: the
   * retry joins the first call instead of asking twice (§9, "Retrying a call"). */
  correlationId?: string;
  /** Its cost budget (§16); `BudgetExhausted` when nothing is left. */
  budget?: BudgetOption;
  /** Files for the callee (§17), as on `send`; the answer's are `answer.attachments`. */
  attachments?: Attachment[];
}

/** Options of `createTask` and `spawn`. */
export interface TaskOptions {
  parts?: Part[];
  deadlineInMs?: number;
  taskId?: string;
  metadata?: Json;
  /** The message that prompted the task (threads it in the audit trail). */
  inReplyTo?: Message;
  /** Receipts for the task message (§8, "Receipts"): when the assignee's session receives
   * (and reads) it. */
  receipt?: 'delivered' | 'read';
  /** Its cost budget (§16); `BudgetExhausted` when nothing is left. */
  budget?: BudgetOption;
  /** Files for the assignee (§17), each as `uploadFile` returned it or a message delivered
   * it; carried in the task message, and the record's `attachments`. */
  attachments?: Attachment[];
}

/** Options of `taskOp`. */
export interface TaskOpOptions {
  parts?: Part[];
  trace?: Trace;
  /** Files for the other party (§17): a progress note's, a question's, or the result's. */
  attachments?: Attachment[];
}

/** One inbox message (§7). `kind`: message, request (a call: `reply`), response, notify,
 * task (work for you: `task()`), task_update, receipt. */
export class Message {
  readonly seq: number;
  readonly raw: Json;
  /** The sender's W3C trace context, carried on by every answer. */
  readonly trace: Trace;
  acked = false;
  /** Set while `serve` runs this message: the loop acknowledges or rejects it. */
  private served: ServedEntry | undefined;

  constructor(readonly agent: Agent, readonly goalId: string, entry: FetchReply['messages'][number]) {
    this.seq = entry.seq;
    this.raw = entry.message as unknown as Json;
    this.trace = { traceparent: entry.traceparent ?? undefined,
      tracestate: entry.tracestate ?? undefined };
  }

  get id(): string | undefined { return this.raw.id as string | undefined; }
  get kind(): string { return (this.raw.kind as string | undefined) ?? 'message'; }
  /** `from_agent_id`: who wrote it. A person's answer comes from the people service,
   * `'people'`: `fromPerson` names the person. */
  get sender(): string { return this.raw.from_agent_id as string; }
  /** The person who wrote this answer (`'person:alice'`; also when the question went to a
   * role), when the people service wrote it (§14, "How the answer arrives"): `from_person` of a
   * message from the reserved id `people`, if it is a valid person or role id. `undefined` for
   * every other message, so no peer can speak as a person. */
  get fromPerson(): string | undefined {
    const person = this.raw.from_person;
    return this.sender === PEOPLE_AGENT && typeof person === 'string' && PARTY.test(person)
      ? person : undefined;
  }
  /** How this message ends your ask or approval `itemId` (the `item_id` of `askPerson`'s or
   * `requestApproval`'s `Parked`), if it does (§14, "Exactly one ending"): `'answered'` for the
   * person's answer or decision (`kind: 'response'`: `body` is the answer, `fromPerson` who
   * gave it, `approved` the decision), `'timed_out'` for the notice that nobody answered by the
   * deadline (`kind: 'notify'`, `metadata.switchboard` `ask_timeout` or `approval_expired`),
   * `undefined` for any other message — an escalation notice (`metadata.switchboard`
   * `escalated`) included: the ending still comes. Each ask and approval gets exactly one
   * ending. Only the people service writes as `people`, so a peer cannot forge one. */
  personAnswer(itemId: string): 'answered' | 'timed_out' | undefined {
    if (this.sender !== PEOPLE_AGENT
      || (this.correlationId ?? '').toLowerCase() !== itemId.toLowerCase()) return undefined;
    if (this.kind === 'response') return 'answered';
    if (this.kind === 'notify' && PERSON_TIMEOUTS.includes(this.metadata.switchboard as string)) {
      return 'timed_out';
    }
    return undefined;
  }
  /** A person's answer to one of your asks or approvals (`kind: 'response'` from the people
   * service; `correlationId` is the item's id, `fromPerson` the person). `personAnswer` tells
   * whether it is the one you wait for. */
  get isPersonAnswer(): boolean {
    return this.sender === PEOPLE_AGENT && this.kind === 'response' && !!this.correlationId;
  }
  /** For a person's decision on your approval: whether they approved it (then `useApproval`
   * it, once, right before acting). `false` for a denial and every other message. */
  get approved(): boolean {
    const people = this.metadata.people as { decision?: unknown } | undefined | null;
    return this.isPersonAnswer && people?.decision === 'approved';
  }
  get body(): string { return (this.raw.body as string | undefined) ?? ''; }
  get parts(): Part[] { return (this.raw.parts as Part[] | undefined) ?? []; }
  /** The files it carries by reference (§17): read one with `agent.readAttachment`, or pass
   * it on in a send's `attachments`. */
  get attachments(): Attachment[] {
    return (this.raw.attachments as Attachment[] | undefined) ?? [];
  }
  get metadata(): Json { return (this.raw.metadata as Json | undefined) ?? {}; }
  get correlationId(): string | undefined { return this.raw.correlation_id as string | undefined; }
  get inReplyTo(): string | undefined { return this.raw.in_reply_to as string | undefined; }
  get ttl(): number | undefined { return this.raw.ttl as number | undefined; }
  /** The cost budget of the work this message gives (§16, `metadata.budget`), set only by
   * Switchboard: report spend with `agent.spend(msg.budget, {...})`. */
  get budget(): Budget | undefined {
    const budget = this.metadata.budget;
    return budget && typeof budget === 'object' ? (budget as unknown as Budget) : undefined;
  }
  /** When a call expires (§9, "Check the deadline before answering"): skip slow work whose
   * answer cannot arrive in time. */
  get callDeadline(): Date | undefined {
    const at = this.metadata.call_deadline as string | undefined;
    return at ? new Date(at) : undefined;
  }
  /** A call waiting for an answer (§9, "Recognising a call"). */
  get isCall(): boolean {
    return this.kind === 'request' && Boolean(this.raw.expects_reply) && !!this.correlationId;
  }
  /** The task a task or task_update message is about, or that an answer to a question names. */
  get taskId(): string | undefined {
    const task = this.raw.task as { id?: string } | undefined;
    return task?.id ?? (this.metadata.task_id as string | undefined);
  }
  get taskState(): string | undefined {
    return (this.raw.task as { state?: string } | undefined)?.state;
  }

  /** @internal `serve` takes over acknowledging this message. */
  serveAs(entry: ServedEntry): void {
    this.served = entry;
  }

  /** Done with this message (and every earlier one of its goal) (§7, ack). Inside `serve`
   * there is nothing to do: the loop acknowledges a message once its handler returned. */
  async ack(): Promise<void> {
    if (this.acked || this.served) return;
    await this.agent.ackInbox({ goal_id: this.goalId, through: this.seq });
    this.acked = true;
    this.agent.doneThrough(this.goalId, this.seq);
  }

  /** Gives up on this message for good (§7, ack with `reject`): it goes to the dead letters
   * with `reason` (an operator can replay it), and counts as done, as do the messages before
   * it. Inside `serve`, it is rejected once its handler returned, after the messages before
   * it are done. */
  async reject(reason: string): Promise<void> {
    if (this.served) {
      this.served.reject = reason;
      return;
    }
    if (this.acked) return;
    await this.agent.ackInbox({ goal_id: this.goalId, seq: this.seq, reject: cut(reason) });
    this.acked = true;
    this.agent.doneThrough(this.goalId, this.seq);
  }

  /** Answers this call (§9). */
  async reply(text: string, opts: { parts?: Part[]; attachments?: Attachment[] } = {}):
    Promise<ReplyAck> {
    if (!this.correlationId) throw new Error('only a call (kind request) takes a reply');
    return this.agent.reply(this.correlationId, text, { ...opts, trace: this.trace });
  }

  /** Part `part` of a streamed answer to this call: 1, then 2, 3…; end the stream with
   * `reply(text)` or `endStream()`. */
  async replyPart(part: number, text: string,
    opts: { parts?: Part[]; attachments?: Attachment[] } = {}): Promise<ReplyAck> {
    if (!this.correlationId) throw new Error('only a call (kind request) takes a reply');
    return this.agent.replyPart(this.correlationId, part, text, { ...opts, trace: this.trace });
  }

  /** Ends this call's streamed answer with no more text: the caller's answer is the parts'
   * text joined. */
  async endStream(): Promise<ReplyAck> {
    if (!this.correlationId) throw new Error('only a call (kind request) takes a reply');
    return this.agent.endStream(this.correlationId, { trace: this.trace });
  }

  /** Answers this call with an error (§9): the caller gets `CallFailed` (`kind`, `text`). */
  async replyError(kind: string, text: string): Promise<ReplyAck> {
    if (!this.correlationId) throw new Error('only a call (kind request) takes a reply');
    return this.agent.replyError(this.correlationId, kind, text, { trace: this.trace });
  }

  /** The error of a parked call's answer (a `kind: response` whose callee failed), if any. */
  get error(): CallError | undefined {
    const error = (this.raw.error ?? this.metadata.error) as CallError | undefined | null;
    return error && typeof error === 'object' ? error : undefined;
  }

  /** Throws `CallFailed` when this is a call's answer that is an error (`error`), as a
   * waiting call would; does nothing otherwise. */
  raiseForError(): void {
    const error = this.error;
    if (this.kind === 'response' && error) {
      throw CallFailed.fromAnswer({ correlation_id: this.correlationId,
        from_agent_id: this.sender, body: this.body, error })!;
    }
  }

  /** For a parked call's streamed answer: the part's number (1, 2, …) while
   * `metadata.partial`; `undefined` for the final answer and every other message. */
  get part(): number | undefined {
    return this.metadata.partial ? (this.metadata.part as number | undefined) : undefined;
  }

  /** Asks this call's caller a question without ending the call (§9, "Asking back"). */
  async askBack(question: string, timeoutMs = 30_000): Promise<CallAnswer> {
    return this.agent.call(this.sender, question, { timeoutMs, serving: this });
  }

  /** Answers a peer's message with one of your own, threaded to it and with its hop budget
   * (§8, "Answering the sender"). */
  async answer(text: string, opts: { parts?: Part[]; metadata?: Json } = {}): Promise<DeliveryReport> {
    return this.agent.send(this.sender, text, { ...opts, inReplyTo: this });
  }

  /** The task a `kind: task` message gives you, to accept, work and finish. */
  task(): TaskHandle {
    if (!this.taskId) throw new Error('this message names no task');
    return new TaskHandle(this.agent, { task_id: this.taskId, message: this.body,
      parts: this.parts, state: this.taskState, message_id: this.id } as TaskRecord, this.trace);
  }
}

/** A task, from either side (§10, "States and who may do what"). */
export class TaskHandle {
  readonly id: string;
  constructor(readonly agent: Agent, public record: TaskRecord, readonly trace?: Trace) {
    this.id = record.task_id;
  }
  get state(): string | undefined { return this.record.state; }
  /** What the assignee's `complete` said (once `completed`). */
  get result(): string | undefined { return this.record.result ?? undefined; }
  /** Why it was rejected, failed or canceled. */
  get reason(): string | undefined { return this.record.reason ?? undefined; }
  private async op(op: string, text?: string, parts?: Part[], attachments?: Attachment[]):
    Promise<TaskHandle> {
    this.record = await this.agent.taskOp(op, this.id, text,
      { parts, trace: this.trace, attachments });
    return this;
  }
  accept() { return this.op('accept'); }
  reject(reason: string) { return this.op('reject', reason); }
  start() { return this.op('start'); }
  /** Tells the requester how it goes; `attachments`: files it may read (§17). */
  progress(note?: string, parts?: Part[], attachments?: Attachment[]) {
    return this.op('progress', note, parts, attachments);
  }
  inputRequired(question: string) { return this.op('input_required', question); }
  /** Finishes it; `attachments` are its files (the record's `result_attachments`). */
  complete(result?: string, parts?: Part[], attachments?: Attachment[]) {
    return this.op('complete', result, parts, attachments);
  }
  fail(reason: string) { return this.op('fail', reason); }
  cancel(reason?: string) { return this.op('cancel', reason); }
  /** Reads it again. */
  async refresh(): Promise<TaskHandle> {
    this.record = await this.agent.getTask(this.id);
    return this;
  }
  /** A subtask of this task. */
  spawn(to: string, text: string, opts: TaskOptions = {}) {
    return this.agent.spawn(this.id, to, text, opts);
  }
  /** (Requester) answers the assignee's question (`input_required`): a message to it naming
   * the task (`metadata.task_id`) in reply to the task (§10: there is no answer op). */
  async answer(text: string): Promise<DeliveryReport> {
    const body: Json = { to: this.record.assignee, message: text, id: crypto.randomUUID(),
      metadata: { task_id: this.id } };
    if (this.agent.goalId) body.from_goal_id = this.agent.goalId;
    if (this.record.message_id) body.in_reply_to = this.record.message_id;
    return this.agent.request<DeliveryReport>(`agent.send.${this.agent.id}`, body);
  }
}

/** A message `serve` fetched, in sequence order: done once its handler returned. */
interface ServedEntry {
  seq: number;
  done: boolean;
  /** Reject it (to the dead letters) with this reason instead of acknowledging it. */
  reject?: string;
}

/** The handler a `close()` is called from, so that it does not wait for itself. */
const handlerScope = new AsyncLocalStorage<Server>();

/** How long a handled message's ack waits to ride on `serve`'s next fetch (`ack_through`)
 * before it is sent on its own, in milliseconds (the Rust client's `ACK_LINGER`). */
export const ACK_LINGER_MS = 25;

/** `Agent.serve`'s loop: fetches, runs up to `max` handlers, acknowledges in order. A busy
 * goal's acks ride on the loop's next fetch; one no fetch's reply confirmed within
 * `ACK_LINGER_MS` is sent on its own. */
class Server {
  private readonly max: number;
  private readonly batch: number;
  private readonly waitMs: number;
  /** Fetched and not yet acknowledged, in sequence order. */
  private readonly window: ServedEntry[] = [];
  /** Fetched and not yet started. */
  private readonly queue: Message[] = [];
  private readonly running = new Set<Promise<void>>();
  /** The highest sequence fetched: the next fetch reads after it (§7 `after`). */
  private highest: number | undefined;
  /** Acknowledgements, one at a time and in order. */
  private acks: Promise<void> = Promise.resolve();
  /** The cumulative ack settled so far, sent or not. */
  private owed = 0;
  /** Where the service last said the cursor is (a fetch's or an ack's reply). */
  private confirmed = 0;
  /** A lingering ack's send is scheduled. */
  private lingering: ReturnType<typeof setTimeout> | undefined;
  private stopping = false;
  private wake: () => void = () => undefined;
  private readonly woken: Promise<void>;
  private loop: Promise<void> | undefined;

  constructor(readonly agent: Agent, readonly goal: string, readonly handler: Handler,
    readonly opts: ServeOptions) {
    this.max = Math.max(1, Math.floor(opts.maxConcurrent ?? 1));
    this.batch = Math.min(64, Math.max(opts.batch ?? 16, this.max));
    this.waitMs = opts.waitMs ?? 1000;
    this.woken = new Promise<void>((resolve) => { this.wake = resolve; });
  }

  run(): Promise<void> {
    this.loop ??= this.fetchAndRun();
    return this.loop;
  }

  /** Takes no new message; resolves once the handlers in progress are done and acknowledged. */
  async drain(): Promise<void> {
    this.stopping = true;
    this.wake();
    try {
      await this.loop;
    } catch {
      // The loop's own failure is `serve`'s to report.
    }
  }

  private async fetchAndRun(): Promise<void> {
    let failure: unknown;
    try {
      while (!this.stopping) {
        if (this.running.size >= this.max) {
          await Promise.race([...this.running, this.woken]);
          continue;
        }
        if (this.queue.length) {
          this.start(this.queue.shift()!);
          continue;
        }
        await this.fetch();
      }
    } catch (err) {
      failure = err;
    }
    // Stopping (or failed): what was fetched and not started stays unacknowledged.
    this.queue.length = 0;
    await Promise.allSettled([...this.running]);
    await this.acks;
    if (this.lingering !== undefined) clearTimeout(this.lingering);
    this.lingering = undefined;
    if (this.owed > this.confirmed) {
      this.acks = this.acks.then(() => this.sendOwed());
      await this.acks;
    }
    if (failure !== undefined) throw failure;
  }

  private async fetch(): Promise<void> {
    const body: Json = { goal_id: this.goal, max: this.batch, wait_ms: this.waitMs };
    if (this.highest !== undefined) body.after = this.highest;
    // Every settled ack rides along (acks are idempotent): no request of its own.
    if (this.owed > 0) body.ack_through = this.owed;
    let page: FetchReply;
    try {
      const fetched = this.agent.fetchPage(body);
      const got = await Promise.race([fetched, this.woken.then(() => undefined)]);
      if (got === undefined) {
        fetched.catch(() => undefined); // a stop while the fetch was held: nothing taken
        return;
      }
      page = got;
      this.confirmed = Math.max(this.confirmed, page.cursor);
    } catch (err) {
      if (this.stopping) return;
      if (err instanceof SwitchboardError && (err.retryable || err.kind === 'conflict')) {
        await Promise.race([sleep(500), this.woken]);
        return;
      }
      throw err;
    }
    for (const entry of page.messages) {
      if (this.highest !== undefined && entry.seq <= this.highest) continue;
      this.highest = entry.seq;
      const message = new Message(this.agent, this.goal, entry);
      const served: ServedEntry = { seq: entry.seq, done: false };
      message.serveAs(served);
      this.window.push(served);
      this.queue.push(message);
    }
  }

  private start(message: Message): void {
    const task = this.handle(message).finally(() => this.running.delete(task));
    this.running.add(task);
  }

  private async handle(message: Message): Promise<void> {
    const entry = (message as unknown as { served: ServedEntry }).served;
    try {
      await handlerScope.run(this, async () => this.handler(message));
    } catch (err) {
      try {
        (this.opts.onError ?? ((e: unknown, m: Message) => {
          console.error(`switchboard: the handler failed on message ${m.seq} (${m.kind}):`, e);
        }))(err, message);
      } catch {
        // An onError that throws changes nothing below.
      }
      const text = errorText(err);
      // `task` is written only by the task service (§8: a send cannot set it).
      const taskId = (message.raw.task as { id?: string } | undefined)?.id;
      if (message.kind === 'task' && taskId) {
        entry.reject = await this.endTask(message, taskId, text);
      } else if (message.isCall) {
        try {
          await message.replyError('handler_error', text);
        } catch (replyErr) {
          // Over already (expired, answered): nothing to keep. Otherwise keep it as a letter.
          if (!(replyErr instanceof SwitchboardError
            && ['expired', 'not_found', 'conflict'].includes(replyErr.kind))) {
            entry.reject = `${text} (its error answer failed: ${errorText(replyErr, 200)})`;
          }
        }
      } else {
        entry.reject = text;
      }
    }
    entry.done = true;
    await this.commit();
  }

  /** Ends the task of a `kind: task` message whose handler threw, so that its requester
   * hears why (§10): `reject` while it is `submitted`; `fail` once this goal accepted it
   * (`start` first from `accepted` or `input_required`: only a `working` task fails); nothing
   * once it ended. `undefined` when that is done (the message is then acknowledged), else the
   * reason to reject the message with (the task is gone, another goal took it, or the fabric
   * refused). */
  private async endTask(message: Message, taskId: string, text: string):
    Promise<string | undefined> {
    const agent = this.agent;
    const reason = text.trim() ? text : 'the handler failed';
    const op = (name: string, body?: string) =>
      agent.taskOp(name, taskId, body, { trace: message.trace });
    try {
      const record = await agent.getTask(taskId);
      const state = record.state;
      if (record.assignee !== agent.id) {
        throw errorFor('not_allowed', 403, `task ${taskId} is not given to ${agent.id}`);
      }
      if (state === 'submitted') {
        await op('reject', reason);
      } else if (state === 'accepted' || state === 'working' || state === 'input_required') {
        const holder = record.assignee_goal;
        if (holder && holder !== this.goal && holder !== agent.goalId) {
          throw errorFor('conflict', 409, `task ${taskId} is held by another goal (${holder})`);
        }
        if (state !== 'working') await op('start');
        await op('fail', reason);
      } else if (!TERMINAL_TASK_STATES.includes(state as string)) {
        throw errorFor('illegal_transition', 409, `task ${taskId} is ${state}: it cannot be ended`);
      }
      return undefined; // ended now, or already: the requester has its answer
    } catch (err) {
      if (err instanceof SwitchboardError && ['expired', 'task_terminal'].includes(err.kind)) {
        return undefined; // it ended meanwhile (its deadline, a cancel): nothing to do
      }
      console.error(`switchboard: could not end task ${taskId} after its handler failed; `
        + 'rejecting its message:', err);
      return `${text} (the task could not be ended: ${errorText(err, 200)})`;
    }
  }

  /** Acknowledges the done messages at the front of the window: one `through` for a run of
   * them, a `reject` for each rejected one (which also covers those before it, §7). */
  private commit(): Promise<void> {
    this.acks = this.acks.then(() => this.flush());
    return this.acks;
  }

  private async flush(): Promise<void> {
    let through: number | undefined;
    while (this.window.length && this.window[0].done) {
      const entry = this.window[0];
      if (entry.reject !== undefined) {
        const ok = await this.ackRequest({ seq: entry.seq, reject: cut(entry.reject) });
        if (!ok) return; // kept at the front: the next commit tries again
        through = undefined;
      } else {
        through = entry.seq;
      }
      this.window.shift();
    }
    if (through !== undefined) {
      // Owed: the next fetch carries it, or the linger sends it. If neither is taken the
      // messages are handed out again after a restart (at least once).
      this.owed = Math.max(this.owed, through);
      if (this.lingering === undefined && this.owed > this.confirmed) this.linger(this.owed);
    }
  }

  /** After `ACK_LINGER_MS`: done if the service has every settled ack; waits again if a
   * fetch confirmed the one it waited for (a busy goal); else sends the owed ack. */
  private linger(waitedFor: number): void {
    this.lingering = setTimeout(() => {
      this.lingering = undefined;
      if (this.owed <= this.confirmed || this.agent.isClosed) return;
      if (this.confirmed >= waitedFor) {
        this.linger(this.owed);
        return;
      }
      this.acks = this.acks.then(() => this.sendOwed());
    }, ACK_LINGER_MS);
  }

  /** Sends the owed ack on its own (if a fetch has not confirmed it meanwhile). */
  private async sendOwed(): Promise<void> {
    const through = this.owed;
    if (through <= this.confirmed) return;
    if (await this.ackRequest({ through })) this.confirmed = Math.max(this.confirmed, through);
  }

  private async ackRequest(body: Json): Promise<boolean> {
    for (let attempt = 0; ; attempt++) {
      try {
        await this.agent.request(`agent.inbox.ack.${this.agent.id}`,
          { goal_id: this.goal, ...body }, { timeoutMs: this.agent.inboxAttemptMs });
        return true;
      } catch (err) {
        const again = err instanceof SwitchboardError && (err.retryable || err.kind === 'conflict');
        if (!again || attempt >= 4) {
          console.error(`switchboard: acknowledging ${JSON.stringify(body)} failed:`, err);
          return false;
        }
        await sleep(200 * (attempt + 1));
      }
    }
  }
}
