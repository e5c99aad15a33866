// Switchboard agents in TypeScript (Node 20+, ESM only): connect to the NATS fabric, serve your
// inbox, send, call and answer, give and work on tasks; hand the fabric to an LLM as tools
// (OpenAI and Anthropic function calling). docs/protocol.md is the contract this implements;
// the wire types (./wire) are generated from docs/schema, the tools from docs/mcp-tools.json.
export {
  ACK_LINGER_MS, Agent, callId, INBOX_ATTEMPT_MS, isParty, Lease, Message, PEOPLE_AGENT, TaskHandle,
} from './agent.js';
export type {
  AskPersonOptions, Budget, BudgetOption, CallOptions, ConnectOptions, Handler, LimitOptions, Part, PartyId,
  RequestApprovalOptions,
  SendOptions, ServeOptions, TaskOptions, TaskRecord, Trace,
} from './agent.js';
export { contextDir, readContext } from './connection.js';
export type { NatsContext, SignIn } from './connection.js';
export * from './errors.js';
export {
  anthropicTools, openaiResponsesTools, openaiTools, renderPeerMessages, TOOL_DEFINITIONS,
  toolDefinitions, Toolbox,
} from './tools.js';
export type {
  AnthropicTool, AnthropicToolResult, AnthropicToolUse, OpenAIResponsesTool,
  OpenAIResponsesToolCall, OpenAIResponsesToolOutput, OpenAITool, OpenAIToolCall,
  OpenAIToolMessage, ResultOf, ToolboxOptions, ToolCall, ToolCallResult, ToolDefinition,
  ToolName, ToolOutcome,
} from './tools.js';
export type * from './wire/index.js';
