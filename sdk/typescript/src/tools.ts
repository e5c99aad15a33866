// The fabric as tools for an LLM's function calling: the 17 tools of `switchboard mcp` (their
// definitions generated from docs/mcp-tools.json into tools.generated.ts), in the OpenAI and
// Anthropic formats, and a Toolbox that runs a model's tool calls as one agent and gives the
// results back in the model's format. A result is what the MCP tool returns: the service's
// reply as pretty JSON (a delivery report, a task record, a call's answer), check_inbox's
// `# PEER MESSAGES` block, or `{"error": {"kind", "message"}}`. A bad call from the model (an
// unknown tool, arguments that are not a JSON object or do not fit the schema) is an error
// result of kind `bad_request`, never an exception: the model reads it and tries again.

import type { Agent, TaskRecord } from './agent.js';
import { isParty, Message } from './agent.js';
import { CallFailed, Internal, SwitchboardError } from './errors.js';
import { TOOL_DEFINITIONS } from './tools.generated.js';
import type { ToolDefinition, ToolName } from './tools.generated.js';
import type {
  Attachment, CallAnswer, CallPart, FetchReply, PersonItem, TaskList,
} from './wire/index.js';

/** Freezes `value` and everything in it: the embedded definitions cannot be changed. */
function deepFreeze<T>(value: T): T {
  if (value && typeof value === 'object' && !Object.isFrozen(value)) {
    Object.freeze(value);
    for (const inner of Object.values(value)) deepFreeze(inner);
  }
  return value;
}
deepFreeze(TOOL_DEFINITIONS);

export { TOOL_DEFINITIONS };
export type { ToolDefinition, ToolName };

type Json = Record<string, unknown>;

// ------------------------------------------------------------------- the definitions
/** A tool in the OpenAI Chat Completions format (`tools` of `chat.completions.create`). */
export interface OpenAITool {
  type: 'function';
  function: { name: ToolName; description: string; parameters: Record<string, unknown> };
}

/** A tool in the OpenAI Responses API format (`tools` of `responses.create`). */
export interface OpenAIResponsesTool {
  type: 'function';
  name: ToolName;
  description: string;
  parameters: Record<string, unknown>;
}

/** A tool in the Anthropic Messages format (`tools` of `messages.create`). */
export interface AnthropicTool {
  name: ToolName;
  description: string;
  input_schema: Record<string, unknown>;
}

/** A copy of the tools as `switchboard mcp` lists them (name, description, inputSchema). */
export function toolDefinitions(): ToolDefinition[] {
  return structuredClone(TOOL_DEFINITIONS) as ToolDefinition[];
}

/** The tools for OpenAI Chat Completions: `[{type: "function", function: {name, description,
 * parameters}}]`, `parameters` the tool's JSON Schema as the MCP server lists it. */
export function openaiTools(): OpenAITool[] {
  return toolDefinitions().map(({ name, description, inputSchema }) =>
    ({ type: 'function', function: { name, description, parameters: inputSchema } }));
}

/** The tools for the OpenAI Responses API: `[{type: "function", name, description,
 * parameters}]`. */
export function openaiResponsesTools(): OpenAIResponsesTool[] {
  return toolDefinitions().map(({ name, description, inputSchema }) =>
    ({ type: 'function', name, description, parameters: inputSchema }));
}

/** The tools for Anthropic Messages: `[{name, description, input_schema}]`. */
export function anthropicTools(): AnthropicTool[] {
  return toolDefinitions().map(({ name, description, inputSchema }) =>
    ({ name, description, input_schema: inputSchema }));
}

// ------------------------------------------------------------------- calls and results
/** A tool call of OpenAI Chat Completions: an item of an assistant message's `tool_calls`
 * (`arguments` is a JSON string). */
export interface OpenAIToolCall {
  id: string;
  type?: string;
  function: { name: string; arguments: string };
}
/** Its result: a message to append to `messages`. */
export interface OpenAIToolMessage {
  role: 'tool';
  tool_call_id: string;
  content: string;
}

/** A tool call of the OpenAI Responses API: an `output` item of type `function_call`. */
export interface OpenAIResponsesToolCall {
  type: 'function_call';
  call_id: string;
  name: string;
  arguments: string;
  id?: string;
  status?: string;
}
/** Its result: an item for the next request's `input`. */
export interface OpenAIResponsesToolOutput {
  type: 'function_call_output';
  call_id: string;
  output: string;
}

/** A tool call of Anthropic Messages: a `tool_use` block of the assistant's `content`. */
export interface AnthropicToolUse {
  type: 'tool_use';
  id: string;
  name: string;
  input: unknown;
}
/** Its result: a block for the next user message's `content` (all of a turn's results go in
 * one user message). */
export interface AnthropicToolResult {
  type: 'tool_result';
  tool_use_id: string;
  content: string;
  is_error: boolean;
}

/** A model's tool call, in any of the three formats. */
export type ToolCall = OpenAIToolCall | OpenAIResponsesToolCall | AnthropicToolUse;
/** A tool call's result, in the format of its call. */
export type ToolCallResult = OpenAIToolMessage | OpenAIResponsesToolOutput | AnthropicToolResult;

type ResultOfCall<C> = C extends { function: unknown } ? OpenAIToolMessage
  : C extends { type: 'function_call' } | { call_id: unknown } ? OpenAIResponsesToolOutput
  : C extends { type: 'tool_use' } | { input: unknown } ? AnthropicToolResult
  : never;
/** The result type of a call type: by format (`never` for an item that is not a tool call, such
 * as an Anthropic text block; any of the three for `any` or `unknown`). */
export type ResultOf<C> = 0 extends (1 & C) ? ToolCallResult
  : unknown extends C ? ToolCallResult : ResultOfCall<C>;

/** What one tool returned: `content` is the text the model reads (JSON, or check_inbox's
 * block), `isError` whether it is an `{"error": {"kind", "message"}}`. */
export interface ToolOutcome {
  name: string;
  content: string;
  isError: boolean;
}

/** Options of a `Toolbox`. */
export interface ToolboxOptions {
  /** The most bytes of one call's arguments (as JSON); more is a `bad_request` result
   * (default 256 KiB). */
  maxArgumentBytes?: number;
  /** The goal check_inbox reads (default: the agent's goal at the time). Do not let
   * `serve` or `messages()` read the same goal: each would take the other's messages. */
  goalId?: string;
  /** Told about each part of a streamed answer while talk_to_agent waits for the rest (what
   * `switchboard mcp` sends as progress notifications). */
  onProgress?: (progress: { tool: 'talk_to_agent'; to: string; part: number; text: string }) => void;
}

const DEFAULT_MAX_ARGUMENT_BYTES = 256 * 1024;
const FETCH_MAX = 64; // protocol §7: the most messages one fetch hands out
const TALK_TIMEOUT_MS = 30_000; // the correlator's default
const TALK_TIMEOUT_MAX_MS = 300_000; // and its maximum
const LIST_LIMIT_MAX = 200; // protocol §10: a task listing's largest page
const PERSON_WAIT_MAX_S = 50; // the longest ask_person / request_approval wait (wait_s)
const PERSON_POLL_MS = 500; // how often such a wait reads the item's state
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
/** Fields that hold ids (UUIDs) in every tool that has them (cli/src/mcp/params.rs). */
const UUID_FIELDS = new Set(['task_id', 'parent_task_id', 'message_id', 'correlation_id',
  'in_reply_to', 'approval_id', 'ref']);
/** Error kinds that are not a refusal: the request may or may not have been taken. */
const NOT_REFUSALS = new Set(['bad_request', 'not_found', 'conflict', 'unavailable', 'internal',
  'timeout', 'unknown', 'no_responders', 'request_timeout']);

/** A refusal the model gets as an error result. */
class ToolError extends Error {
  constructor(readonly kind: string, message: string) {
    super(message);
  }
}

const bad = (message: string) => new ToolError('bad_request', message);

/** Text for a message, cut to a length a model can read in full. */
function brief(value: unknown, max = 80): string {
  let text: string;
  try {
    text = typeof value === 'string' ? value : JSON.stringify(value) ?? String(value);
  } catch {
    text = String(value);
  }
  return text.length > max ? `${text.slice(0, max)}…` : text;
}

interface PropertySchema {
  type?: string | string[];
  enum?: unknown[];
  minimum?: number;
  format?: string;
}

function typeOk(type: string, value: unknown): boolean {
  switch (type) {
    case 'string': return typeof value === 'string';
    case 'integer': return typeof value === 'number' && Number.isInteger(value);
    case 'number': return typeof value === 'number' && Number.isFinite(value);
    case 'boolean': return typeof value === 'boolean';
    case 'array': return Array.isArray(value);
    case 'object': return !!value && typeof value === 'object' && !Array.isArray(value);
    case 'null': return value === null;
    default: return true;
  }
}

/** Checks `args` against the tool's schema (what the MCP layer's parameter types accept) and
 * returns them with the `null`s of optional fields dropped. Fields the schema does not name
 * are ignored, as the MCP server ignores them. */
function checkArguments(tool: ToolDefinition, args: Json): Json {
  const schema = tool.inputSchema as { properties?: Record<string, PropertySchema>;
    required?: string[] };
  const properties = schema.properties ?? {};
  for (const field of schema.required ?? []) {
    // A field of any JSON (no `type`: use_approval's `arguments`) may be null.
    const anyJson = properties[field] && properties[field].type === undefined;
    if (args[field] === undefined || (args[field] === null && !anyJson)) {
      throw bad(`${tool.name}: \`${field}\` is required`);
    }
  }
  const out: Json = {};
  for (const [field, value] of Object.entries(args)) {
    const property = properties[field];
    if (!property || value === undefined) continue;
    const types = property.type === undefined ? [] : [property.type].flat();
    if (value === null) {
      if (types.length && !types.includes('null')) {
        throw bad(`${tool.name}: \`${field}\` cannot be null`);
      }
      if (!types.length) out[field] = null; // any JSON: null is a value
      continue;
    }
    const wanted = types.filter((type) => type !== 'null');
    if (wanted.length && !wanted.some((type) => typeOk(type, value))) {
      throw bad(`${tool.name}: \`${field}\` must be ${wanted.join(' or ')}, not ${brief(value)}`);
    }
    if (property.enum && !property.enum.includes(value)) {
      throw bad(`${tool.name}: \`${field}\` must be one of ${property.enum.join(', ')}, not `
        + `${brief(value)}`);
    }
    if (typeof value === 'number') {
      if (property.minimum !== undefined && value < property.minimum) {
        throw bad(`${tool.name}: \`${field}\` must be at least ${property.minimum}`);
      }
      const max = property.format === 'uint32' ? 0xffff_ffff : Number.MAX_SAFE_INTEGER;
      if (value > max) throw bad(`${tool.name}: \`${field}\` is too large (at most ${max})`);
    }
    if (UUID_FIELDS.has(field) && typeof value === 'string') {
      if (!UUID.test(value)) throw bad(`${tool.name}: \`${field}\` is not an id (a UUID): ${brief(value)}`);
      out[field] = value.toLowerCase();
      continue;
    }
    if (field === 'receipt' && value !== 'delivered' && value !== 'read') {
      throw bad(`${tool.name}: \`receipt\` must be "delivered" or "read", not ${brief(value)}`);
    }
    out[field] = value;
  }
  return out;
}

/** The MCP error kind of a failure: the service's kind, or `unavailable` / `timeout` /
 * `transport` when no service answered (as `switchboard mcp` says). */
function failure(err: unknown): { kind: string; message: string } {
  if (err instanceof ToolError) return { kind: err.kind, message: err.message };
  if (err instanceof SwitchboardError) {
    const kind = err.kind === 'no_responders' ? 'unavailable'
      : err.kind === 'request_timeout' ? 'timeout' : err.kind;
    return { kind, message: err.message };
  }
  return { kind: 'transport', message: (err as Error)?.message || String(err) };
}

/** Whether `err` is a service's refusal (the request was not taken). */
function isRefusal(err: unknown): boolean {
  return err instanceof SwitchboardError && !(err instanceof CallFailed)
    && !(err instanceof Internal) && !NOT_REFUSALS.has(err.kind);
}

/** A request check_inbox showed that waits for this agent's answer. */
interface Unanswered {
  correlationId: string;
  message: Message;
  deadline: number | undefined;
}

/** The seed's `# PEER MESSAGES` block (protocol §7, "Showing messages to an LLM"), as
 * `switchboard mcp`'s check_inbox renders it. A person's answer (from the people service, with
 * `from_person`) shows the person as its sender: `from="person:alice"`. */
export function renderPeerMessages(messages: readonly Message[]): string | undefined {
  if (!messages.length) return undefined;
  let out = '# PEER MESSAGES\n';
  for (const message of messages) {
    const raw = message.raw;
    // Only the people service (the reserved id) sets `from_person`; a valid person id holds
    // no quote.
    const sender = message.fromPerson ?? message.sender;
    out += `<peer-message from="${sender}" sent_at="${String(raw.sent_at ?? '')}"`;
    if (message.id) out += ` message_id="${message.id}"`;
    if (message.correlationId) out += ` correlation_id="${message.correlationId}"`;
    if (message.kind !== 'message') out += ` kind="${message.kind}"`;
    const task = raw.task as { id?: string; state?: string } | undefined | null;
    if (task?.id) out += ` task_id="${task.id}" task_state="${task.state ?? ''}"`;
    const files = ((raw.attachments as Json[] | undefined) ?? [])
      .filter((file) => file && typeof file === 'object');
    if (files.length) out += ` attachments="${files.length}"`;
    out += '>\n';
    for (const file of files) {
      out += `<attachment ref="${String(file.ref ?? '')}" name="${escape(String(file.name ?? ''))}" `
        + `media_type="${escape(String(file.media_type ?? ''))}" size="${Number(file.size ?? 0)}"/>\n`;
    }
    // A body can neither close its element nor add a file to the message in words.
    out += message.body.replaceAll('</peer-message', '<\\/peer-message')
      .replaceAll('<attachment', '<\\attachment');
    out += '\n</peer-message>\n';
  }
  return out;
}

/** `text` as an XML attribute value. */
const escape = (text: string) => text.replaceAll('&', '&amp;').replaceAll('<', '&lt;')
  .replaceAll('>', '&gt;').replaceAll('"', '&quot;');

/** A message's most attachments (docs/protocol.md §17). */
const ATTACHMENTS_MAX = 16;
/** read_attachment shows text of at most this many bytes. */
const TEXT_SHOWN_MAX = 64 * 1024;
const TEXT_TYPES = new Set(['application/json', 'application/xml', 'application/yaml',
  'application/toml', 'application/csv']);

type Handler = (args: Json) => Promise<unknown>;

const str = (args: Json, field: string) => args[field] as string;
const opt = <T>(args: Json, field: string) => args[field] as T | undefined;
/** Seconds (a people tool's argument) as the wire's milliseconds. */
const ms = (seconds: number | undefined) =>
  seconds === undefined ? undefined : Math.min(seconds * 1000, Number.MAX_SAFE_INTEGER);

/** What a waiting people tool returns (as `switchboard mcp`): the item's id, state, to and
 * addressee and, once answered, who answered what (and an approval's decision and hash); keys
 * in order, as the MCP server writes them. */
function personSummary(item: PersonItem): Json {
  const out: Json = { item_id: item.item_id, state: item.state, to: item.to,
    addressee: item.addressee };
  // What the model calls it: the approval_id use_approval takes, or the ask's id.
  out[item.kind === 'approval' ? 'approval_id' : 'ask_id'] = item.item_id;
  if (item.answer) {
    out.answered_by = item.answer.by;
    out.answer = item.answer.message ?? null;
    if (item.answer.decision) out.decision = item.answer.decision;
  }
  if (item.action_hash) out.action_hash = item.action_hash;
  return Object.fromEntries(Object.entries(out).sort(([a], [b]) => (a < b ? -1 : 1)));
}

/**
 * The fabric's tools bound to one agent (`agent.tools`, or `new Toolbox(agent, options)`):
 * the definitions for a model, and `run` for the calls it makes. Each tool is a request as
 * this agent, its result what `switchboard mcp` returns. It keeps what check_inbox showed:
 * the requests waiting for an answer (reply_to_peer without `correlation_id` answers the most
 * recent; talk_to_agent made meanwhile is part of that call, §9) and the parts sent of a
 * partial answer.
 */
export class Toolbox {
  private readonly unanswered: Unanswered[] = [];
  /** The last part number sent per request answered in parts. */
  private readonly parts = new Map<string, number>();
  /** check_inbox, one at a time (a fetch and its ack). */
  private inbox: Promise<unknown> = Promise.resolve();
  private readonly handlers: Record<ToolName, Handler>;

  constructor(readonly agent: Agent, readonly options: ToolboxOptions = {}) {
    this.handlers = {
      list_peers: (args) => this.agent.peersPage({ after: opt(args, 'after'),
        limit: opt(args, 'limit'), skill: opt(args, 'skill') }),
      // To a person or a role: a note (its NoteReport), as the MCP tool.
      send_to_peer: async (args) => {
        if (isParty(str(args, 'to'))) {
          if (opt<string[]>(args, 'attachments')?.length) {
            throw bad('a note to a person carries text only, no attachments');
          }
          return this.agent.notePerson(str(args, 'to'), str(args, 'message'));
        }
        return this.agent.send(str(args, 'to'), str(args, 'message'), {
          inReplyTo: opt(args, 'in_reply_to'), correlationId: opt(args, 'correlation_id'),
          receipt: opt(args, 'receipt'), attachments: await this.attachments(args) });
      },
      message_status: (args) => this.agent.sendStatus(str(args, 'message_id')),
      talk_to_agent: (args) => this.talk(args),
      reply_to_peer: (args) => this.replyToPeer(args),
      check_inbox: () => this.checkInbox(),
      create_task: async (args) => this.agent.createTaskReply(str(args, 'to'),
        str(args, 'message'), { deadlineInMs: opt(args, 'deadline_in_ms'),
          receipt: opt(args, 'receipt'), attachments: await this.attachments(args) }),
      update_task: async (args) => this.agent.taskOpReply(str(args, 'action'),
        str(args, 'task_id'), opt(args, 'message'),
        { attachments: await this.attachments(args) }),
      spawn_subagent: (args) => this.agent.createTaskReply(opt(args, 'agent') ?? 'self',
        str(args, 'message'), { deadlineInMs: opt(args, 'deadline_in_ms') },
        str(args, 'parent_task_id')),
      complete_task: async (args) => this.agent.taskOpReply('complete', str(args, 'task_id'),
        str(args, 'result'), { attachments: await this.attachments(args) }),
      read_attachment: (args) => this.readAttachment(str(args, 'ref')),
      subagent_status: (args) => this.status(args),
      cancel_task: (args) => this.agent.taskOpReply('cancel', str(args, 'task_id'),
        opt(args, 'reason')),
      pending_requests: () => this.agent.pendingCalls(),
      // The people tools (cli/src/mcp/people.rs): seconds in the arguments, milliseconds on
      // the wire; ask_person and request_approval wait up to `wait_s` for the answer.
      list_people: () => this.agent.people(),
      ask_person: async (args) => {
        const parked = await this.agent.askPerson(str(args, 'to'), str(args, 'question'), {
          goalId: this.answerGoal(), timeoutMs: ms(opt(args, 'timeout_s')),
          escalateAfterMs: ms(opt(args, 'escalate_after_s')),
          escalateTo: opt(args, 'escalate_to') });
        return this.waitForPerson(parked.item_id, opt(args, 'wait_s'));
      },
      request_approval: async (args) => {
        const parked = await this.agent.requestApproval(str(args, 'tool'), args.arguments,
          str(args, 'reason'), str(args, 'to'), ms(opt<number>(args, 'expires_in_s'))!, {
            goalId: this.answerGoal(), escalateAfterMs: ms(opt(args, 'escalate_after_s')),
            escalateTo: opt(args, 'escalate_to') });
        return this.waitForPerson(parked.item_id, opt(args, 'wait_s'));
      },
      use_approval: (args) => this.agent.useApproval(str(args, 'approval_id'), str(args, 'tool'),
        args.arguments),
    };
  }

  /** The definitions as `switchboard mcp` lists them. */
  definitions(): ToolDefinition[] {
    return toolDefinitions();
  }

  /** The tools for OpenAI Chat Completions (`openaiTools()`). */
  openai(): OpenAITool[] {
    return openaiTools();
  }

  /** The tools for the OpenAI Responses API (`openaiResponsesTools()`). */
  openaiResponses(): OpenAIResponsesTool[] {
    return openaiResponsesTools();
  }

  /** The tools for Anthropic Messages (`anthropicTools()`). */
  anthropic(): AnthropicTool[] {
    return anthropicTools();
  }

  /** Runs one tool by name. `args`: an object, or its JSON text (as OpenAI sends it; empty
   * text is `{}`). Never throws: a bad call or a refusal is an outcome with `isError`. */
  async call(name: string, args: unknown): Promise<ToolOutcome> {
    try {
      const tool = TOOL_DEFINITIONS.find((definition) => definition.name === name);
      if (!tool) {
        throw bad(`there is no tool ${JSON.stringify(brief(name, 64))}; the tools are `
          + `${TOOL_DEFINITIONS.map((definition) => definition.name).join(', ')}`);
      }
      const checked = checkArguments(tool, this.parse(tool.name, args));
      const result = await this.handlers[tool.name](checked);
      return { name: tool.name, isError: false,
        content: typeof result === 'string' ? result : JSON.stringify(result, null, 2) };
    } catch (err) {
      return { name: typeof name === 'string' ? name : '', isError: true,
        content: JSON.stringify({ error: failure(err) }) };
    }
  }

  /** Runs a model's tool call and returns its result in the call's format:
   * - OpenAI Chat `{id, type: "function", function: {name, arguments}}` →
   *   `{role: "tool", tool_call_id, content}`;
   * - OpenAI Responses `{type: "function_call", call_id, name, arguments}` →
   *   `{type: "function_call_output", call_id, output}`;
   * - Anthropic `{type: "tool_use", id, name, input}` →
   *   `{type: "tool_result", tool_use_id, content, is_error}`.
   *
   * A bad call from the model is an error result, never an exception; only a value in none of
   * the formats (a programming error) throws a `TypeError`. */
  async run<C extends ToolCall>(call: C): Promise<ResultOf<C>>;
  async run(call: unknown): Promise<ToolCallResult>;
  async run(call: unknown): Promise<ToolCallResult> {
    const format = formatOf(call);
    if (!format) {
      throw new TypeError(`not a tool call of OpenAI Chat, OpenAI Responses or Anthropic: ${brief(call)}`);
    }
    const c = call as Json;
    if (format === 'anthropic') {
      const outcome = await this.call(c.name as string, c.input ?? {});
      return { type: 'tool_result', tool_use_id: String(c.id ?? ''), content: outcome.content,
        is_error: outcome.isError };
    }
    if (format === 'responses') {
      const outcome = await this.call(c.name as string, c.arguments);
      return { type: 'function_call_output', call_id: String(c.call_id ?? ''),
        output: outcome.content };
    }
    const fn = (c.function ?? {}) as Json;
    const outcome = await this.call(fn.name as string, fn.arguments);
    return { role: 'tool', tool_call_id: String(c.id ?? ''), content: outcome.content };
  }

  /** Runs every tool call of a model's turn, one after the other in order, and returns their
   * results in order. Takes a list (an assistant message's `tool_calls`, an Anthropic
   * message's `content`, a Responses `output`; items that are not tool calls, such as text
   * blocks, are skipped) or the message itself (`{tool_calls}`, `{content}`, `{output}`).
   * OpenAI Chat: append each result to `messages`; Anthropic: send them all as the `content` of
   * one user message; Responses: add them to the next `input`. */
  async runAll<I>(calls: readonly I[]): Promise<ResultOf<I>[]>;
  async runAll<I>(message: { tool_calls?: readonly I[] | null }): Promise<ResultOf<I>[]>;
  async runAll<I>(message: { content: readonly I[] | string | null }): Promise<ResultOf<I>[]>;
  async runAll<I>(response: { output: readonly I[] }): Promise<ResultOf<I>[]>;
  async runAll(calls: unknown): Promise<ToolCallResult[]> {
    let items: unknown = calls;
    if (items && typeof items === 'object' && !Array.isArray(items)) {
      const message = items as Json;
      items = message.tool_calls ?? (Array.isArray(message.output) ? message.output
        : Array.isArray(message.content) ? message.content : []);
    }
    if (!Array.isArray(items)) {
      throw new TypeError(`not a list of tool calls nor a message holding them: ${brief(calls)}`);
    }
    const results: ToolCallResult[] = [];
    for (const item of items) {
      if (formatOf(item)) results.push(await this.run(item));
    }
    return results;
  }

  /** The arguments as an object: parsed when JSON text, bounded in size. */
  private parse(tool: string, args: unknown): Json {
    const max = this.options.maxArgumentBytes ?? DEFAULT_MAX_ARGUMENT_BYTES;
    if (args === undefined || args === null) return {};
    let value = args;
    if (typeof args === 'string') {
      const bytes = Buffer.byteLength(args, 'utf8');
      if (bytes > max) throw bad(`${tool}: the arguments are ${bytes} bytes, more than ${max}`);
      if (!args.trim()) return {};
      try {
        value = JSON.parse(args);
      } catch (err) {
        throw bad(`${tool}: the arguments are not JSON (${(err as Error).message}): ${brief(args)}`);
      }
    } else {
      let text: string | undefined;
      try {
        text = JSON.stringify(args);
      } catch {
        throw bad(`${tool}: the arguments cannot be written as JSON`);
      }
      const bytes = Buffer.byteLength(text ?? '', 'utf8');
      if (bytes > max) throw bad(`${tool}: the arguments are ${bytes} bytes, more than ${max}`);
    }
    if (!value || typeof value !== 'object' || Array.isArray(value)) {
      throw bad(`${tool}: the arguments must be a JSON object, not ${brief(value)}`);
    }
    return value as Json;
  }

  // ----------------------------------------------------------------- the stateful tools
  /** The most recent request shown and not answered whose caller still waits. */
  private lastRequest(): Unanswered | undefined {
    const now = Date.now();
    for (let i = this.unanswered.length - 1; i >= 0; i--) {
      const deadline = this.unanswered[i].deadline;
      if (deadline !== undefined && deadline <= now) this.unanswered.splice(i, 1);
    }
    return this.unanswered.at(-1);
  }

  private answered(correlationId: string): void {
    this.parts.delete(correlationId);
    const at = this.unanswered.findIndex((r) => r.correlationId === correlationId);
    if (at >= 0) this.unanswered.splice(at, 1);
  }

  private checkInbox(): Promise<string> {
    const run = this.inbox.then(() => this.readInbox());
    this.inbox = run.catch(() => undefined);
    return run;
  }

  /** One page of unread messages, rendered, then acknowledged (each is shown once); if the
   * fetch or the ack fails they stay unread and show again next time. */
  private async readInbox(): Promise<string> {
    const agent = this.agent;
    const goal = this.options.goalId ?? agent.goalId;
    if (!goal) throw bad('check_inbox: this agent has no goal (inbox) open');
    const page = await agent.request<FetchReply>(`agent.inbox.fetch.${agent.id}`,
      { goal_id: goal, max: FETCH_MAX, wait_ms: 0 });
    const messages = page.messages.map((entry) => new Message(agent, goal, entry));
    let text = renderPeerMessages(messages) ?? 'No new messages.';
    const more = (page.unread ?? 0) - messages.length;
    if (more > 0) {
      text += `\n(${more} more unread message(s): call check_inbox again to read them)`;
    }
    if (page.expired_unread) {
      text += `\n(${page.expired_unread.count} message(s) to you were removed unread because `
        + 'your inbox was full; their senders were told)';
    }
    if (messages.length) await messages[messages.length - 1].ack();
    for (const message of messages) {
      if (!message.isCall || this.unanswered.some((r) => r.correlationId === message.correlationId)) {
        continue;
      }
      const deadline = message.callDeadline?.getTime();
      this.unanswered.push({ correlationId: message.correlationId!, message,
        deadline: Number.isNaN(deadline) ? undefined : deadline });
    }
    return text;
  }

  private async replyToPeer(args: Json): Promise<unknown> {
    let target = opt<string>(args, 'correlation_id') ?? this.lastRequest()?.correlationId;
    if (!target) {
      const pending = await this.agent.pendingCalls();
      target = pending.incoming.at(-1)?.correlation_id;
      if (!target) {
        throw new ToolError('not_found',
          'no request is waiting for your answer; use send_to_peer to message a peer');
      }
    }
    const trace = this.unanswered.find((r) => r.correlationId === target)?.message.trace;
    const text = str(args, 'message');
    const attachments = await this.attachments(args);
    if (args.partial === true) {
      const part = (this.parts.get(target) ?? 0) + 1;
      this.parts.set(target, part);
      try {
        return await this.agent.replyPart(target, part, text, { trace, attachments });
      } catch (err) {
        // Only a part refused outright gives its number back; one that may have been taken
        // (a timeout) keeps it, so the next part is not mistaken for its retry.
        if (isRefusal(err) || (err instanceof SwitchboardError && err.kind === 'bad_request')) {
          this.parts.set(target, part - 1);
        }
        throw err;
      }
    }
    try {
      const ack = await this.agent.reply(target, text, { trace, attachments });
      this.answered(target);
      return ack;
    } catch (err) {
      if (isRefusal(err) || (err instanceof SwitchboardError && err.kind === 'not_found')) {
        this.answered(target);
      }
      throw err;
    }
  }

  /** A waiting call, streamed: each part goes to `onProgress`, the result is the whole
   * answer. Made while a request shown by check_inbox waits for this agent's answer, it is
   * part of that call (§9, the chain; to its caller: a question back). */
  private async talk(args: Json): Promise<CallAnswer | Json> {
    const to = str(args, 'to');
    const timeoutMs = Math.min(opt<number>(args, 'timeout_ms') ?? TALK_TIMEOUT_MS,
      TALK_TIMEOUT_MAX_MS);
    const serving = this.lastRequest()?.message;
    const attachments = await this.attachments(args);
    let answer: CallAnswer | undefined;
    try {
      for await (const event of this.agent.callStream(to, str(args, 'message'),
        { timeoutMs, receipt: opt(args, 'receipt'), serving, attachments })) {
        if ('partial' in event) {
          const part = event as CallPart;
          try {
            this.options.onProgress?.({ tool: 'talk_to_agent', to, part: part.part,
              text: part.body });
          } catch {
            // A listener's failure is not the call's.
          }
        } else {
          answer = event;
        }
      }
    } catch (err) {
      // The callee answered with an error: that is its answer, as the MCP tool returns it.
      if (err instanceof CallFailed) return err.answer;
      throw err;
    }
    if (!answer) throw new ToolError('transport', 'the call ended without an answer');
    return answer;
  }

  /** The file refs of `args.attachments` as attachments (each stat'ed: a complete file this
   * agent may pass on), as the MCP server resolves them. */
  private async attachments(args: Json): Promise<Attachment[]> {
    const refs = (args.attachments as unknown[] | undefined) ?? [];
    if (refs.length > ATTACHMENTS_MAX) {
      throw bad(`${refs.length} attachments; a message carries at most ${ATTACHMENTS_MAX}`);
    }
    const files: Attachment[] = [];
    for (const ref of refs) {
      if (typeof ref !== 'string' || !UUID.test(ref)) {
        throw bad(`an attachment must be a file ref (a UUID), not ${brief(String(ref))}`);
      }
      const view = await this.agent.request<{ state: string; attachment: Attachment }>(
        `agent.files.stat.${this.agent.id}`, { file_id: ref.toLowerCase() });
      if (view.state !== 'complete') throw bad(`file ${ref} is still being uploaded`);
      files.push(view.attachment);
    }
    return files;
  }

  /** read_attachment: a file's attachment, and its text when it is text of at most 64 KiB. */
  private async readAttachment(ref: string): Promise<Json> {
    const [attachment] = await this.attachments({ attachments: [ref] });
    const type = attachment.media_type.toLowerCase();
    const text = type.startsWith('text/') || type.endsWith('+json') || type.endsWith('+xml')
      || TEXT_TYPES.has(type);
    if (!text || attachment.size > TEXT_SHOWN_MAX) {
      return { attachment, note: `not shown: ${attachment.media_type} of ${attachment.size} `
        + `bytes (text of at most ${TEXT_SHOWN_MAX} bytes is shown)` };
    }
    const bytes = await this.agent.readAttachment(attachment);
    try {
      return { attachment, text: new TextDecoder('utf-8', { fatal: true }).decode(bytes) };
    } catch {
      return { attachment, note: 'not shown: the bytes are not UTF-8 text' };
    }
  }

  /** The goal a person's answer comes to: where check_inbox reads. */
  private answerGoal(): string {
    const goal = this.options.goalId ?? this.agent.goalId;
    if (!goal) throw bad('this agent has no goal (inbox) open for the answer');
    return goal;
  }

  /** Reads item `itemId` until it leaves `open` / `escalated` or `waitS` (at most 50 s)
   * passed; its summary either way. */
  private async waitForPerson(itemId: string, waitS: number | undefined): Promise<Json> {
    const until = Date.now() + Math.min(waitS ?? 0, PERSON_WAIT_MAX_S) * 1000;
    for (;;) {
      const item = await this.agent.personItem(itemId);
      if ((item.state !== 'open' && item.state !== 'escalated') || Date.now() >= until) {
        return personSummary(item);
      }
      await new Promise((resolve) => setTimeout(resolve, PERSON_POLL_MS));
    }
  }

  private async status(args: Json): Promise<TaskRecord | TaskRecord[]> {
    const taskId = opt<string>(args, 'task_id');
    if (taskId) return this.agent.getTask(taskId);
    const parent = opt<string>(args, 'parent_task_id');
    if (!parent) throw bad('give task_id or parent_task_id');
    const tasks: TaskRecord[] = [];
    let cursor: string | undefined;
    for (;;) {
      const filters: Json = { parent, limit: LIST_LIMIT_MAX };
      if (cursor) filters.cursor = cursor;
      const page: TaskList = await this.agent.listTasks(filters);
      tasks.push(...(page.tasks as TaskRecord[]));
      if (!page.next_cursor) return tasks;
      cursor = page.next_cursor;
    }
  }
}

/** Which format a value is a tool call of, if any. */
function formatOf(call: unknown): 'openai' | 'responses' | 'anthropic' | undefined {
  if (!call || typeof call !== 'object' || Array.isArray(call)) return undefined;
  const c = call as Json;
  if (c.type === 'tool_use') return 'anthropic';
  if (c.type === 'function_call') return 'responses';
  if ('function' in c || c.type === 'function') return 'openai';
  return undefined;
}
