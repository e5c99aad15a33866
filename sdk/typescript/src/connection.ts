// How an agent signs in to NATS, as NATS users do: a credentials file (`creds`), an NKey seed
// file (`nkeySeed`, what `switchboard nats-config` writes per agent), or a NATS CLI context by
// name (`context`: its URL, credentials and TLS files). Everything is read and checked before
// connecting, so a missing or malformed file is an error naming the file, not a refusal by the
// server.

import { readFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { isAbsolute, join } from 'node:path';

import {
  credsAuthenticator, nkeyAuthenticator, tokenAuthenticator, usernamePasswordAuthenticator,
} from '@nats-io/transport-node';
import type { Authenticator, NodeConnectionOptions } from '@nats-io/transport-node';

/** How to reach and sign in to NATS: the part of `ConnectOptions` this module reads. */
export interface SignIn {
  /** Path to a NATS credentials file (`.creds`: a user JWT and its NKey seed). */
  creds?: string;
  /** Path to an NKey seed file (`switchboard nats-config` writes `agents/<id>.nk`), or the seed
   * itself (`SU…`). */
  nkeySeed?: string;
  /** A NATS CLI context by name: `$XDG_CONFIG_HOME/nats/context/<name>.json` (default
   * `~/.config/nats/context/<name>.json`), as `nats context save` writes it. With neither a URL
   * nor `context`, the context `$NATS_CONTEXT` names is used, if it is set. */
  context?: string;
}

/** The fields of a NATS CLI context this SDK uses (the others are ignored). */
export interface NatsContext {
  /** The file it was read from. */
  path: string;
  url?: string;
  creds?: string;
  nkey?: string;
  user?: string;
  password?: string;
  token?: string;
  ca?: string;
  cert?: string;
  key?: string;
  tls_first?: boolean;
}

/** The environment variable the nats CLI reads a context name from: used when `connect` is
 * given neither a URL nor a `context`. */
export const CONTEXT_ENV = 'NATS_CONTEXT';

/** A seed as `nkeys` encodes one: `S`, the key type, then base32 (58 characters in all). */
const SEED = /^S[A-Z2-7]{57}$/;

/** The folder NATS CLI contexts live in: `$XDG_CONFIG_HOME/nats/context`, or
 * `~/.config/nats/context` when XDG_CONFIG_HOME is unset or not absolute (the XDG rule). */
export function contextDir(): string {
  const xdg = process.env.XDG_CONFIG_HOME;
  const base = xdg && isAbsolute(xdg) ? xdg : join(homedir(), '.config');
  return join(base, 'nats', 'context');
}

/** `~/…` expanded, as the NATS CLI does for the paths in a context. */
function expandHome(path: string): string {
  if (path === '~') return homedir();
  return path.startsWith('~/') ? join(homedir(), path.slice(2)) : path;
}

function readText(path: string, what: string): string {
  try {
    return readFileSync(path, 'utf8');
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    const why = code === 'ENOENT' ? 'no such file'
      : code === 'EACCES' ? 'permission denied'
      : code === 'EISDIR' ? 'a folder, not a file' : (err as Error).message;
    throw new Error(`${what} ${path}: ${why}`);
  }
}

/** Reads the NATS CLI context `name`. Throws for a name that is not a plain file name (a `/`,
 * `\`, `..`), a context that does not exist, or a file that is not a JSON object. */
export function readContext(name: string): NatsContext {
  if (typeof name !== 'string' || !name.trim() || /[/\\\0]/.test(name) || name.includes('..')) {
    throw new Error(`NATS context ${JSON.stringify(name)}: not a context name (no '/', '\\' `
      + `or '..'; the name of a file in ${contextDir()})`);
  }
  const path = join(contextDir(), `${name}.json`);
  let data: unknown;
  try {
    data = JSON.parse(readText(path, `NATS context "${name}":`));
  } catch (err) {
    if (err instanceof SyntaxError) throw new Error(`NATS context "${name}": ${path} is not JSON: ${err.message}`);
    throw err;
  }
  if (!data || typeof data !== 'object' || Array.isArray(data)) {
    throw new Error(`NATS context "${name}": ${path} is not a JSON object`);
  }
  const context: NatsContext = { path };
  const raw = data as Record<string, unknown>;
  for (const field of ['url', 'creds', 'nkey', 'user', 'password', 'token', 'ca', 'cert', 'key'] as const) {
    const value = raw[field];
    if (value === undefined || value === null || value === '') continue;
    if (typeof value !== 'string') {
      throw new Error(`NATS context "${name}": \`${field}\` in ${path} is not a string`);
    }
    context[field] = value;
  }
  if (raw.tls_first === true) context.tls_first = true;
  return context;
}

/** `authenticator`, tried once (it parses its file and derives the key) so that a malformed
 * file is reported now, naming the file. */
function checked(authenticator: Authenticator, what: string): Authenticator {
  try {
    authenticator(undefined);
  } catch (err) {
    throw new Error(`${what}: ${(err as Error).message || 'unreadable'}`);
  }
  return authenticator;
}

/** The authenticator of a credentials file (a user JWT, then its NKey seed). */
function credsFrom(path: string, what: string): Authenticator {
  const text = readText(path, what);
  if (!/-{3,}[^\n]*JWT[^\n]*-{3,}/.test(text) || !/-{3,}[^\n]*SEED[^\n]*-{3,}/.test(text)) {
    throw new Error(`${what} ${path}: not a NATS credentials file (a user JWT block, then an `
      + 'NKey seed block)');
  }
  return checked(credsAuthenticator(new TextEncoder().encode(text)), `${what} ${path}`);
}

/** The authenticator of an NKey seed, or of the seed in a file. */
function nkeyFrom(seedOrPath: string, what: string): Authenticator {
  let seed = seedOrPath.trim();
  let source = 'the seed given';
  if (!SEED.test(seed)) {
    source = seedOrPath;
    // Seed files end with a newline (`switchboard nats-config` writes them so).
    seed = readText(seedOrPath, what).trim();
    if (!SEED.test(seed)) throw new Error(`${what} ${source}: not an NKey seed (one line, \`S…\`)`);
  }
  return checked(nkeyAuthenticator(new TextEncoder().encode(seed)), `${what} ${source}`);
}

/** The servers, authenticator and TLS files of a connection: `natsUrl` when given, else the
 * context's URL (the `context` option's, else, with no URL either, `$NATS_CONTEXT`'s);
 * `creds` or `nkeySeed` when given (an empty string is none), else the context's
 * credentials (creds, nkey, user and password, or token, the first the context has). */
export function signIn(natsUrl: string | string[] | null | undefined, options: SignIn):
  Pick<NodeConnectionOptions, 'servers' | 'authenticator' | 'tls'> {
  if (options.creds && options.nkeySeed) {
    throw new Error('give `creds` or `nkeySeed`, not both');
  }
  let servers: string | string[] | undefined = natsUrl ?? undefined;
  const noUrl = servers === undefined || (Array.isArray(servers) && !servers.length)
    || servers === '';
  // With neither a URL nor a context, the context $NATS_CONTEXT names (as the nats CLI does).
  const contextName = options.context
    ?? (noUrl && process.env[CONTEXT_ENV] ? process.env[CONTEXT_ENV] : undefined);
  const context = contextName !== undefined ? readContext(contextName) : undefined;
  const from = context ? `NATS context "${contextName}" (${context.path}):` : '';
  if (noUrl) {
    servers = context?.url?.split(',').map((url) => url.trim()).filter(Boolean);
    if (!servers?.length) {
      throw new Error(context ? `${from} no \`url\`: give the NATS URL to connect` : 'no NATS URL: '
        + 'give one (e.g. nats://127.0.0.1:4222), a `context` that has a `url`, or '
        + `$${CONTEXT_ENV}`);
    }
  }
  let authenticator: Authenticator | undefined;
  if (options.creds) {
    authenticator = credsFrom(expandHome(options.creds), 'NATS credentials file (creds)');
  } else if (options.nkeySeed) {
    authenticator = nkeyFrom(expandHome(options.nkeySeed), 'NKey seed file (nkeySeed)');
  } else if (context?.creds) {
    authenticator = credsFrom(expandHome(context.creds), `${from} credentials file (creds)`);
  } else if (context?.nkey) {
    authenticator = nkeyFrom(expandHome(context.nkey), `${from} NKey seed file (nkey)`);
  } else if (context?.user) {
    authenticator = usernamePasswordAuthenticator(context.user, context.password);
  } else if (context?.token) {
    authenticator = tokenAuthenticator(context.token);
  }
  let tls: NodeConnectionOptions['tls'];
  if (context && (context.ca || context.cert || context.key || context.tls_first)) {
    if (!context.cert !== !context.key) {
      throw new Error(`${from} \`cert\` and \`key\` go together (a client certificate and its key)`);
    }
    tls = {};
    for (const [field, option] of [['ca', 'caFile'], ['cert', 'certFile'], ['key', 'keyFile']] as const) {
      const path = context[field];
      if (!path) continue;
      const file = expandHome(path);
      readText(file, `${from} TLS file (${field})`); // there and readable: say so now
      tls[option] = file;
    }
    if (context.tls_first) tls.handshakeFirst = true;
  }
  return { servers, authenticator, tls };
}
