// Switchboard agents in TypeScript (Node 20+, ESM only): connect to the NATS fabric, serve your
// inbox, send, call and answer, give and work on tasks. docs/protocol.md is the contract this
// implements; the wire types (./wire) are generated from docs/schema.
export { Agent, Message, TaskHandle } from './agent.js';
export type {
  CallOptions, ConnectOptions, Handler, Part, ServeOptions, TaskOptions, TaskRecord, Trace,
} from './agent.js';
export * from './errors.js';
export type * from './wire/index.js';
