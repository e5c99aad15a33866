// An agent on a Switchboard fabric (docs/protocol.md is the contract; sections cited below).
// The same surface as the Python SDK (sdk/python), with TypeScript names.

import { connect, createInbox, headers, nkeyAuthenticator, RequestError, TimeoutError }
  from '@nats-io/transport-node';
import type { Msg, MsgHdrs, NatsConnection } from '@nats-io/transport-node';

import { errorFor, Unavailable } from './errors.js';
import type {
  AgentCard, CallAnswer, CallParked, CallPart, CallParts, DeliveryReport, FetchReply,
  LookupReply, PeersReply, PendingCalls, ReplyAck, SendRequest, SendStatusReply, TaskList,
  TaskReply,
} from './wire/index.js';

/** A message part (§7): text, data or a file reference. */
export type Part = NonNullable<SendRequest['parts']>[number];

type Json = Record<string, unknown>;
/** The task record every task op answers with (docs/schema/TaskReply.json). */
export type TaskRecord = TaskReply['task'];
/** W3C trace context carried by a request (§1 "Trace context"). */
export type Trace = { traceparent?: string; tracestate?: string };

const HEARTBEAT_EVERY_MS = 10_000; // §4.2: offline after 30 s of silence
const REQUEST_TIMEOUT_MS = 10_000; // a send may retry a goal's delivery for up to 8 s (§8)
const CALL_TIMEOUT_MS = 30_000; // §9: the correlator's default

/** What `Agent.connect` takes besides the URL and the id. */
export interface ConnectOptions {
  description?: string;
  capabilities?: string[];
  /** More card fields (§5): skills, ACLs, max_concurrent_tasks, metadata. */
  card?: Partial<AgentCard>;
  /** Sign in with this NKey seed (`switchboard nats-config` writes one per agent). */
  nkeySeed?: string;
  goalKind?: 'interactive' | 'background' | 'daemon';
  /** Re-open this goal (one this agent held before a restart) instead of a fresh one: its
   * unread messages and task updates are still there. */
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
  if (data && typeof data === 'object' && ('error' in data || code)) {
    const err = ((data as Json).error ?? {}) as Json;
    throw errorFor(String(err.kind ?? 'unknown'), Number(err.code ?? code ?? 500),
      String(err.message ?? msg.headers?.get('Nats-Service-Error') ?? ''));
  }
  return data as T;
}

/** One agent: its NATS connection, its card, its current goal. Build it with `connect`. */
export class Agent {
  goalId: string | undefined;
  private beats: NodeJS.Timeout | undefined;
  private closed = false;

  private constructor(readonly nc: NatsConnection, readonly id: string,
    readonly requestTimeoutMs: number) {}

  /** Connects as `agentId`, registers its card (§4.1), opens a goal (§4.4) and heartbeats
   * every 10 s. Replies arrive under `_INBOX.<agentId>`, the only inboxes the generated NATS
   * accounts let an agent read. Call `close()` when the agent stops. */
  static async connect(natsUrl: string | string[], agentId: string,
    options: ConnectOptions = {}): Promise<Agent> {
    const nc = await connect({
      servers: natsUrl,
      name: `switchboard-ts-${agentId}`,
      inboxPrefix: `_INBOX.${agentId}`,
      // Seed files end with a newline (`switchboard nats-config` writes them so).
      authenticator: options.nkeySeed
        ? nkeyAuthenticator(new TextEncoder().encode(options.nkeySeed.trim())) : undefined,
    });
    const agent = new Agent(nc, agentId, options.requestTimeoutMs ?? REQUEST_TIMEOUT_MS);
    try {
      await agent.request(`agent.registry.register.${agentId}`, {
        description: options.description ?? '',
        capabilities: options.capabilities ?? [],
        ...options.card,
      });
      if (options.openGoal ?? true) {
        await agent.openGoal({ kind: options.goalKind ?? 'daemon', goalId: options.goalId });
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

  /** Closes the current goal (its inbox is purged, §4.5), deregisters (§4.3), disconnects.
   * With `keepGoal`, only disconnects: the goal keeps its messages for a restart
   * (`connect(..., {goalId})`), and the directory marks the agent offline 30 s later. */
  async close(opts: { keepGoal?: boolean } = {}): Promise<void> {
    if (this.closed) return;
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

  /** Whether `close` was called. */
  get isClosed(): boolean {
    return this.closed;
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
  /** Opens a goal, an inbox of its own (§4.4); it becomes the current goal. */
  async openGoal(opts: { goalId?: string; kind?: string; overflow?: string } = {}):
    Promise<string> {
    const body: Json = { kind: opts.kind ?? 'daemon' };
    if (opts.goalId) body.goal_id = opts.goalId;
    if (opts.overflow) body.overflow = opts.overflow;
    const reply = await this.request<{ goal_id: string }>(`agent.registry.goal.open.${this.id}`, body);
    this.goalId = reply.goal_id;
    return reply.goal_id;
  }

  /** Closes a goal and purges its inbox (§4.5). */
  async closeGoal(goalId: string): Promise<Json> {
    const reply = await this.request(`agent.registry.goal.close.${this.id}`, { goal_id: goalId });
    if (goalId === this.goalId) this.goalId = undefined;
    return reply;
  }

  /** The agents this one may reach, with cards and status (§4.6): whom an LLM may ask.
   * Every page, unless `limit` asks for one page of that size. */
  async listPeers(opts: { limit?: number; after?: string } = {}): Promise<PeersReply['peers']> {
    const peers: PeersReply['peers'] = [];
    let after = opts.after;
    for (;;) {
      const page = await this.request<PeersReply>(`agent.registry.peers.${this.id}`,
        { ...opts, after });
      peers.push(...page.peers);
      if (opts.limit !== undefined || !page.next) return peers;
      after = page.next;
    }
  }

  /** One agent's card, status and live goals (§4.7). */
  async lookup(agentId: string): Promise<LookupReply> {
    return this.request<LookupReply>(`agent.registry.lookup.${this.id}`, { agent_id: agentId });
  }

  // ------------------------------------------------------------------- the inbox
  /** The goal's inbox as it fills (§7), fetched in batches held up to `waitMs`. A message is
   * acknowledged when the loop asks for the next one, after your handler returned (at least
   * once); call `message.ack()` before a `break`. Ends when the agent closes. */
  async *messages(opts: { goalId?: string; batch?: number; waitMs?: number } = {}):
    AsyncGenerator<Message> {
    const goal = opts.goalId ?? this.goalId;
    if (!goal) throw new Error('no goal: open one first');
    const waitMs = opts.waitMs ?? 1000;
    while (!this.closed) {
      let page: FetchReply;
      try {
        page = await this.request<FetchReply>(`agent.inbox.fetch.${this.id}`,
          { goal_id: goal, max: opts.batch ?? 16, wait_ms: waitMs },
          { timeoutMs: this.requestTimeoutMs + waitMs });
      } catch (err) {
        if (this.closed) return; // closed while a fetch was held: the loop just ends
        throw err;
      }
      for (const entry of page.messages) {
        const message = new Message(this, goal, entry);
        yield message;
        await message.ack();
      }
    }
  }

  // ------------------------------------------------------------------- messages
  /** send_to_peer (§8): into every live goal of `to`; the delivery report. Use it to tell,
   * not to ask (`call` waits). `receipt` asks for delivered/read receipts; `inReplyTo`
   * threads it and passes on the hop budget. */
  async send(to: string, text: string, opts: {
    parts?: Part[]; metadata?: Json; receipt?: 'delivered' | 'read'; inReplyTo?: Message;
    messageId?: string;
  } = {}): Promise<DeliveryReport> {
    const body: Json = { to, message: text, id: opts.messageId ?? crypto.randomUUID() };
    if (this.goalId) body.from_goal_id = this.goalId;
    if (opts.parts?.length) body.parts = opts.parts;
    if (opts.metadata) body.metadata = opts.metadata;
    if (opts.receipt) body.receipt = opts.receipt;
    if (opts.inReplyTo) {
      body.in_reply_to = opts.inReplyTo.id;
      if (opts.inReplyTo.raw.ttl !== undefined) body.ttl = opts.inReplyTo.raw.ttl;
    }
    return this.request<DeliveryReport>(`agent.send.${this.id}`, body,
      { trace: opts.inReplyTo?.trace });
  }

  /** A message to every agent this one may reach (§8, `to: "*"`). */
  async broadcast(text: string, opts: Parameters<Agent['send']>[2] = {}): Promise<DeliveryReport> {
    return this.send('*', text, opts);
  }

  /** One message, acknowledged at once (`undefined` when none came within `waitMs`): for a
   * script waiting for one answer. It shares the goal's cursor with `messages()`: do not use
   * both on one goal at once. */
  async nextMessage(opts: { goalId?: string; waitMs?: number } = {}): Promise<Message | undefined> {
    const goal = opts.goalId ?? this.goalId;
    const waitMs = opts.waitMs ?? 5000;
    const page = await this.request<FetchReply>(`agent.inbox.fetch.${this.id}`,
      { goal_id: goal, max: 1, wait_ms: waitMs }, { timeoutMs: this.requestTimeoutMs + waitMs });
    for (const entry of page.messages) {
      const message = new Message(this, goal!, entry);
      await message.ack();
      return message;
    }
    return undefined;
  }

  /** Where a message sent with a receipt is, per goal (§8, Receipts). */
  async sendStatus(messageId: string): Promise<SendStatusReply> {
    return this.request<SendStatusReply>(`agent.send.status.${this.id}`, { message_id: messageId });
  }

  // ------------------------------------------------------------------- calls
  private callBody(to: string, text: string, opts: CallOptions): Json {
    const body: Json = { to, message: text, timeout_ms: opts.timeoutMs ?? CALL_TIMEOUT_MS,
      correlation_id: opts.correlationId ?? crypto.randomUUID() };
    if (this.goalId) body.from_goal_id = this.goalId;
    if (opts.parts?.length) body.parts = opts.parts;
    if (opts.metadata) body.metadata = opts.metadata;
    if (opts.serving) {
      if (opts.serving.correlationId) body.parent_correlation_id = opts.serving.correlationId;
      body.in_reply_to = opts.serving.id;
    }
    return body;
  }

  /** Asks `to` and waits for the answer (§9). `serving` is the call being answered while
   * this one is made (its deadline bounds this one). Throws `CallTimeout` in time. */
  async call(to: string, text: string, opts: CallOptions = {}): Promise<CallAnswer> {
    const body = this.callBody(to, text, opts);
    return this.request<CallAnswer>(`agent.call.${this.id}`, body, {
      trace: opts.serving?.trace,
      timeoutMs: Number(body.timeout_ms) + this.requestTimeoutMs,
    });
  }

  /** Asks without waiting (§9, `wait: false`): the answer lands in this goal's inbox. */
  async callParked(to: string, text: string, opts: CallOptions = {}): Promise<CallParked> {
    const body: Json = { ...this.callBody(to, text, opts), wait: false };
    return this.request<CallParked>(`agent.call.${this.id}`, body, { trace: opts.serving?.trace });
  }

  /** Asks and yields the answer as it comes (§9, "Streamed answers"): each part in order
   * (gaps read back), then the final answer. Throws `CallTimeout` past the deadline (after
   * reading back what the call has, in case the answer itself was lost). */
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
    opts: { parts?: Part[]; trace?: Trace } = {}): Promise<ReplyAck> {
    const body: Json = { correlation_id: correlationId, message: text };
    if (opts.parts?.length) body.parts = opts.parts;
    return this.request<ReplyAck>(`agent.reply.${this.id}`, body, { trace: opts.trace });
  }

  /** Part `part` (1, 2, …) of a streamed answer (§9); finish with `reply`. */
  async replyPart(correlationId: string, part: number, text: string,
    opts: { parts?: Part[]; trace?: Trace } = {}): Promise<ReplyAck> {
    const body: Json = { correlation_id: correlationId, message: text, partial: true, part };
    if (opts.parts?.length) body.parts = opts.parts;
    return this.request<ReplyAck>(`agent.reply.${this.id}`, body, { trace: opts.trace });
  }

  // ------------------------------------------------------------------- tasks
  /** Hands `to` work with a state, followed to its end (§10): for work that takes long, may
   * ask questions or splits into subtasks. Updates come to this goal. */
  async createTask(to: string, text: string, opts: TaskOptions = {}): Promise<TaskHandle> {
    const reply = await this.request<TaskReply>(`agent.task.create.${this.id}`,
      this.taskBody(to, text, opts));
    return new TaskHandle(this, reply.task);
  }

  /** A subtask of the task this agent works on (§10); `to: "self"` keeps it. */
  async spawn(parentTaskId: string, to: string, text: string, opts: TaskOptions = {}):
    Promise<TaskHandle> {
    const reply = await this.request<TaskReply>(`agent.task.spawn.${this.id}`,
      { ...this.taskBody(to, text, opts), parent_task_id: parentTaskId });
    return new TaskHandle(this, reply.task);
  }

  private taskBody(to: string, text: string, opts: TaskOptions): Json {
    const body: Json = { to, message: text, task_id: opts.taskId ?? crypto.randomUUID() };
    if (this.goalId) body.from_goal_id = this.goalId;
    if (opts.parts?.length) body.parts = opts.parts;
    if (opts.deadlineInMs !== undefined) body.deadline_in_ms = opts.deadlineInMs;
    if (opts.metadata) body.metadata = opts.metadata;
    if (opts.inReplyTo) body.in_reply_to = opts.inReplyTo.id;
    return body;
  }

  /** Cancels a task this agent gave, and its open subtasks (§10). */
  async cancelTask(taskId: string, reason?: string): Promise<TaskRecord> {
    return this.taskOp('cancel', taskId, reason);
  }

  /** One transition (§10): accept, reject, start, progress, input_required, complete,
   * fail, cancel; the task after it. */
  async taskOp(op: string, taskId: string, text?: string,
    opts: { parts?: Part[]; trace?: Trace } = {}): Promise<TaskRecord> {
    const body: Json = { task_id: taskId };
    if (text !== undefined) body.message = text;
    if (opts.parts?.length) body.parts = opts.parts;
    if (op === 'accept' && this.goalId) body.from_goal_id = this.goalId;
    return (await this.request<TaskReply>(`agent.task.${op}.${this.id}`, body,
      { trace: opts.trace })).task;
  }

  /** A task this agent is a party of (§10). */
  async getTask(taskId: string): Promise<TaskRecord> {
    return (await this.request<TaskReply>(`agent.task.get.${this.id}`, { task_id: taskId })).task;
  }

  /** This agent's tasks (§10): role, state, parent, peer, limit, cursor, newest_first. */
  async listTasks(filters: Json = {}): Promise<TaskList> {
    return this.request<TaskList>(`agent.task.list.${this.id}`, filters);
  }
}

/** Options of `call`, `callParked` and `callStream`. */
export interface CallOptions {
  timeoutMs?: number;
  parts?: Part[];
  metadata?: Json;
  /** The call being answered while this one is made (§9, the chain and budgets). */
  serving?: Message;
  /** The call's id. Choose it and send the same call again with it after `Unavailable`: the
   * retry joins the first call instead of asking twice (§9, "Retrying a call"). */
  correlationId?: string;
}

/** Options of `createTask` and `spawn`. */
export interface TaskOptions {
  parts?: Part[];
  deadlineInMs?: number;
  taskId?: string;
  metadata?: Json;
  /** The message that prompted the task (threads it in the audit trail). */
  inReplyTo?: Message;
}

/** One inbox message (§7). `kind`: message, request (a call: `reply`), response, notify,
 * task (work for you: `task()`), task_update, receipt. */
export class Message {
  readonly seq: number;
  readonly raw: Json;
  /** The sender's W3C trace context, carried on by every answer. */
  readonly trace: Trace;
  acked = false;

  constructor(readonly agent: Agent, readonly goalId: string, entry: FetchReply['messages'][number]) {
    this.seq = entry.seq;
    this.raw = entry.message as unknown as Json;
    this.trace = { traceparent: entry.traceparent ?? undefined,
      tracestate: entry.tracestate ?? undefined };
  }

  get id(): string | undefined { return this.raw.id as string | undefined; }
  get kind(): string { return (this.raw.kind as string | undefined) ?? 'message'; }
  get sender(): string { return this.raw.from_agent_id as string; }
  get body(): string { return (this.raw.body as string | undefined) ?? ''; }
  get parts(): Part[] { return (this.raw.parts as Part[] | undefined) ?? []; }
  get metadata(): Json { return (this.raw.metadata as Json | undefined) ?? {}; }
  get correlationId(): string | undefined { return this.raw.correlation_id as string | undefined; }
  get inReplyTo(): string | undefined { return this.raw.in_reply_to as string | undefined; }
  get ttl(): number | undefined { return this.raw.ttl as number | undefined; }
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

  /** Done with this message (and every earlier one of its goal) (§7, ack). */
  async ack(): Promise<void> {
    if (this.acked) return;
    await this.agent.request(`agent.inbox.ack.${this.agent.id}`,
      { goal_id: this.goalId, through: this.seq });
    this.acked = true;
  }

  /** Answers this call (§9). */
  async reply(text: string, opts: { parts?: Part[] } = {}): Promise<ReplyAck> {
    if (!this.correlationId) throw new Error('only a call (kind request) takes a reply');
    return this.agent.reply(this.correlationId, text, { ...opts, trace: this.trace });
  }

  /** Part `part` of a streamed answer to this call. */
  async replyPart(part: number, text: string): Promise<ReplyAck> {
    if (!this.correlationId) throw new Error('only a call (kind request) takes a reply');
    return this.agent.replyPart(this.correlationId, part, text, { trace: this.trace });
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
  private async op(op: string, text?: string, parts?: Part[]): Promise<TaskHandle> {
    this.record = await this.agent.taskOp(op, this.id, text, { parts, trace: this.trace });
    return this;
  }
  accept() { return this.op('accept'); }
  reject(reason: string) { return this.op('reject', reason); }
  start() { return this.op('start'); }
  progress(note?: string, parts?: Part[]) { return this.op('progress', note, parts); }
  inputRequired(question: string) { return this.op('input_required', question); }
  complete(result?: string, parts?: Part[]) { return this.op('complete', result, parts); }
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
