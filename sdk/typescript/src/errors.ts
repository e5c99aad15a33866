// The error kinds of docs/protocol.md §2 as one class hierarchy: a refusal is
// {"error": {"code", "kind", "message"}}; the SDK throws the class of its kind. Catch a family
// (`Busy`, `NotFound`, …) to decide what to do, or `SwitchboardError` for all.

/** A request a service refused, or one no service answered. */
export class SwitchboardError extends Error {
  /** Whether the same request may simply be sent again. */
  readonly retryable: boolean = false;
  /** The service's (or callee's) own text, without the kind and code `message` adds. */
  readonly detail: string;
  constructor(readonly kind: string, readonly code: number, message: string) {
    super(`${kind} (${code}): ${message}`);
    this.name = new.target.name;
    this.detail = message;
  }
}
/** The request itself is wrong: fix it, do not retry it as it is. */
export class BadRequest extends SwitchboardError {}
/** A rule says no: ACLs, identity, who may act on a task or answer a call; a person denied
 * the approval. */
export class AccessDenied extends SwitchboardError {}
/** No such thing for you: an agent, goal, call or task. */
export class NotFound extends SwitchboardError {}
/** The state forbids it (a task that ended, a cycle, an approval not decided or used already,
 * or for another action), or a race was lost. */
export class Conflict extends SwitchboardError {}
/** Over a cap or a budget: back off, then retry. */
export class Busy extends SwitchboardError {
  override readonly retryable = true;
}
/** The budget the work draws on has nothing left (§16): finish with what you have. */
export class BudgetExhausted extends SwitchboardError {}
/** A deadline passed: the call or task is over. */
export class Expired extends SwitchboardError {}
/** A waiting call got no answer by its deadline. */
export class CallTimeout extends SwitchboardError {}
/** What a callee's error answer says (§9, `error` on a final reply). */
export interface CallError {
  /** The callee's word for it: 1–64 characters of [a-z0-9_]; `handler_error` when its
   * handler threw inside `serve`. */
  kind: string;
  /** Its text, at most 1024 characters. */
  message: string;
}

/** The callee answered with an error instead of an answer (§9, `error` on a reply): its
 * handler threw inside `serve` (kind `handler_error`) or it chose to fail
 * (`message.replyError(kind, text)`). Not the fabric's refusal: `kind` is the callee's word,
 * `detail` its text, `code` is always 502. Thrown by `call`, `callStream` and `askBack`; a
 * parked call's answer carries it as `message.error` (`message.raiseForError()` throws it).
 * Do not retry it as it is: the callee will likely fail again. */
export class CallFailed extends SwitchboardError {
  /** The whole answer (`correlation_id`, `from_agent_id`, `answered_at`, `error`). */
  readonly answer: Record<string, unknown>;
  /** Who answered. */
  readonly callee: string | undefined;
  readonly correlationId: string | undefined;
  constructor(kind: string, message: string,
    opts: { callee?: string; answer?: Record<string, unknown> } = {}) {
    super(kind, 502, message);
    this.message = `${opts.callee ? `\`${opts.callee}\` failed` : 'the callee failed'}: ${kind}: ${message}`;
    this.callee = opts.callee;
    this.answer = opts.answer ?? {};
    this.correlationId = this.answer.correlation_id as string | undefined;
  }

  /** The error an answer carrying `error` stands for, or `undefined` for a real answer: a
   * `CallAnswer`, a read-back's answer, or a `kind: response` inbox message's JSON. */
  static fromAnswer(answer: Record<string, unknown> | undefined | null): CallFailed | undefined {
    const error = answer?.error as Partial<CallError> | undefined | null;
    if (!error || typeof error !== 'object') return undefined;
    return new CallFailed(String(error.kind || 'unknown'), String(error.message ?? ''),
      { callee: answer!.from_agent_id as string | undefined, answer: answer! });
  }
}
/** The fabric could not do it now; safe to retry the same request. */
export class Unavailable extends SwitchboardError {
  override readonly retryable = true;
}
/** A service failed, or sent a kind this SDK does not know. */
export class Internal extends SwitchboardError {}

const families: [new (kind: string, code: number, message: string) => SwitchboardError, string[]][] = [
  [BadRequest, ['bad_request', 'invalid_agent_id', 'invalid_goal_id', 'missing_to', 'self_send',
    'empty_message', 'body_too_large', 'broadcast_too_large', 'file_too_large',
    'digest_mismatch', 'quota_exceeded']],
  [AccessDenied, ['identity_mismatch', 'bad_reply_subject', 'not_callee', 'not_allowed',
    'acl_denied', 'sender_mismatch', 'approval_denied', 'not_addressee']],
  [NotFound, ['not_registered', 'not_found', 'unreachable']],
  [Conflict, ['conflict', 'task_terminal', 'illegal_transition', 'cycle', 'depth_exceeded',
    'action_mismatch', 'approval_pending', 'approval_used', 'already_answered']],
  [Busy, ['at_capacity', 'too_many_children', 'too_many_calls', 'too_many_goals', 'rate_limited',
    'inbox_full', 'limited']],
  [BudgetExhausted, ['budget_exhausted']],
  [Expired, ['expired']],
  [CallTimeout, ['timeout']],
  [Unavailable, ['unavailable', 'no_responders', 'request_timeout']],
];

/** The error for a reply of `kind` (unknown kinds are `Internal`). */
export function errorFor(kind: string, code: number, message: string): SwitchboardError {
  for (const [cls, kinds] of families) {
    if (kinds.includes(kind)) return new cls(kind, code, message);
  }
  return new Internal(kind, code, message);
}
