// The error kinds of docs/protocol.md §2 as one class hierarchy: a refusal is
// {"error": {"code", "kind", "message"}}; the SDK throws the class of its kind. Catch a family
// (`Busy`, `NotFound`, …) to decide what to do, or `SwitchboardError` for all.

/** A request a service refused, or one no service answered. */
export class SwitchboardError extends Error {
  /** Whether the same request may simply be sent again. */
  readonly retryable: boolean = false;
  constructor(readonly kind: string, readonly code: number, message: string) {
    super(`${kind} (${code}): ${message}`);
    this.name = new.target.name;
  }
}
/** The request itself is wrong: fix it, do not retry it as it is. */
export class BadRequest extends SwitchboardError {}
/** A rule says no: ACLs, identity, who may act on a task or answer a call. */
export class AccessDenied extends SwitchboardError {}
/** No such thing for you: an agent, goal, call or task. */
export class NotFound extends SwitchboardError {}
/** The state forbids it (a task that ended, a cycle), or a race was lost. */
export class Conflict extends SwitchboardError {}
/** Over a cap or a budget: back off, then retry. */
export class Busy extends SwitchboardError {
  override readonly retryable = true;
}
/** A deadline passed: the call or task is over. */
export class Expired extends SwitchboardError {}
/** A waiting call got no answer by its deadline. */
export class CallTimeout extends SwitchboardError {}
/** The fabric could not do it now; safe to retry the same request. */
export class Unavailable extends SwitchboardError {
  override readonly retryable = true;
}
/** A service failed, or sent a kind this SDK does not know. */
export class Internal extends SwitchboardError {}

const families: [new (kind: string, code: number, message: string) => SwitchboardError, string[]][] = [
  [BadRequest, ['bad_request', 'invalid_agent_id', 'invalid_goal_id', 'missing_to', 'self_send',
    'empty_message', 'body_too_large', 'broadcast_too_large']],
  [AccessDenied, ['identity_mismatch', 'bad_reply_subject', 'not_callee', 'not_allowed',
    'acl_denied', 'sender_mismatch']],
  [NotFound, ['not_registered', 'not_found', 'unreachable']],
  [Conflict, ['conflict', 'task_terminal', 'illegal_transition', 'cycle', 'depth_exceeded']],
  [Busy, ['at_capacity', 'too_many_children', 'too_many_calls', 'too_many_goals', 'rate_limited',
    'inbox_full']],
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
