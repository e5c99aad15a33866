// Files by reference (docs/protocol.md §17): upload a file of any size to the files service,
// put the attachment it returns on a send or a call (`attachments: [...]`), and read the
// attachments of the messages delivered to you. The bytes are stored once, however many agents
// read or forward them.
import { createHash, randomUUID } from 'node:crypto';
import { open, rename, rm } from 'node:fs/promises';
import { basename } from 'node:path';

import { createInbox, headers } from '@nats-io/transport-node';
import type { Msg } from '@nats-io/transport-node';

import type { Agent } from './agent.js';
import { decodeReply } from './agent.js';
import { SwitchboardError, Unavailable } from './errors.js';
import type { Attachment, ChunkReply, FileView, ReadEnd, UploadReply } from './wire/index.js';

/** Headers of an upload's chunk, and of a read's chunks (§17). */
export const HEADER_FILE_ID = 'Switchboard-File-Id';
export const HEADER_FILE_OFFSET = 'Switchboard-File-Offset';
/** Attempts of one chunk or read while no replica answers or its reply is lost. */
const ATTEMPTS = 6;
/** How long one chunk's or read's reply may take. */
const CHUNK_TIMEOUT_MS = 10_000;
/** Chunks one read asks for (the service answers with at most 16). */
const READ_CHUNKS = 16;

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Uploads `data` as `name` of `mediaType`; returns its attachment. */
export async function uploadBytes(agent: Agent, name: string, mediaType: string,
  data: Uint8Array): Promise<Attachment> {
  const sha256 = createHash('sha256').update(data).digest('hex');
  const started = await agent.request<UploadReply>(`agent.files.upload.${agent.id}`,
    { name, media_type: mediaType, size: data.length, sha256, upload_id: randomUUID() });
  if (data.length === 0) {
    const view = await agent.request<FileView>(`agent.files.stat.${agent.id}`,
      { file_id: started.file_id });
    return view.attachment;
  }
  let offset = 0;
  for (;;) {
    const part = data.subarray(offset, Math.min(data.length, offset + started.chunk_bytes));
    const reply = await sendChunk(agent, started.file_id, offset, part);
    if (reply.attachment) return reply.attachment;
    if (reply.received !== offset + part.length) {
      throw new Unavailable('upload', 503,
        `the service stands at ${reply.received} after the chunk at ${offset}`);
    }
    offset = reply.received;
  }
}

/** Uploads the file at `path` (its name is the path's last part). */
export async function uploadFile(agent: Agent, path: string, mediaType: string):
  Promise<Attachment> {
  const file = await open(path, 'r');
  try {
    return await uploadBytes(agent, basename(path), mediaType, await file.readFile());
  } finally {
    await file.close();
  }
}

async function sendChunk(agent: Agent, fileId: string, offset: number, part: Uint8Array):
  Promise<ChunkReply> {
  const subject = `agent.files.chunk.${agent.id}`;
  const hdrs = headers();
  hdrs.set(HEADER_FILE_ID, fileId);
  hdrs.set(HEADER_FILE_OFFSET, String(offset));
  let pause = 100;
  for (let attempt = 1; ; attempt++) {
    try {
      const msg = await agent.nc.request(subject, part, { timeout: CHUNK_TIMEOUT_MS, headers: hdrs });
      return decodeReply<ChunkReply>(subject, msg);
    } catch (err) {
      if (err instanceof SwitchboardError || attempt >= ATTEMPTS) throw err;
      await sleep(pause);
      pause *= 2;
    }
  }
}

/** One read from `offset`: its chunks and its end, sent again while no replica answers. */
async function readChunks(agent: Agent, fileId: string, offset: number, afterSeq?: number):
  Promise<[Array<[number, Uint8Array]>, ReadEnd]> {
  const subject = `agent.files.read.${agent.id}`;
  const body: Record<string, unknown> = { file_id: fileId, offset, chunks: READ_CHUNKS };
  if (afterSeq !== undefined) body.after_seq = afterSeq;
  let pause = 100;
  for (let attempt = 1; ; attempt++) {
    try {
      return await readOnce(agent, subject, JSON.stringify(body));
    } catch (err) {
      if (!(err instanceof Unavailable) || attempt >= ATTEMPTS) throw err;
      await sleep(pause);
      pause *= 2;
    }
  }
}

async function readOnce(agent: Agent, subject: string, payload: string):
  Promise<[Array<[number, Uint8Array]>, ReadEnd]> {
  const inbox = createInbox(`_INBOX.${agent.id}`);
  const sub = agent.nc.subscribe(inbox, { timeout: CHUNK_TIMEOUT_MS });
  const chunks: Array<[number, Uint8Array]> = [];
  try {
    agent.nc.publish(subject, payload, { reply: inbox });
    for await (const msg of sub as AsyncIterable<Msg>) {
      const offset = msg.headers?.get(HEADER_FILE_OFFSET);
      if (offset) {
        chunks.push([Number(offset), msg.data]);
        continue;
      }
      return [chunks, decodeReply<ReadEnd>(subject, msg)];
    }
  } catch (err) {
    if (err instanceof SwitchboardError) throw err;
    throw new Unavailable('request_timeout', 504, `no reply on ${subject} in time`);
  } finally {
    sub.unsubscribe();
  }
  throw new Unavailable('request_timeout', 504, `no reply on ${subject} in time`);
}

/** The whole file of `attachment`, its size and SHA-256 checked (`NotFound` when it is not
 * yours to read). */
export async function readAttachment(agent: Agent, attachment: Attachment): Promise<Uint8Array> {
  const hash = createHash('sha256');
  const parts: Uint8Array[] = [];
  let offset = 0;
  let afterSeq: number | undefined;
  for (;;) {
    const [chunks, end] = await readChunks(agent, attachment.ref, offset, afterSeq);
    for (const [at, data] of chunks) {
      if (at !== offset) throw new SwitchboardError('internal', 500, 'a chunk out of order');
      hash.update(data);
      parts.push(data);
      offset += data.length;
    }
    afterSeq = end.after_seq ?? undefined;
    if (end.eof) break;
  }
  if (offset !== attachment.size || hash.digest('hex') !== attachment.sha256) {
    throw new SwitchboardError('internal', 500,
      "the bytes read do not match the attachment's size and sha256");
  }
  return Buffer.concat(parts);
}

/** Saves an attachment's file at `path`, whole or not at all; returns its size. */
export async function saveAttachment(agent: Agent, attachment: Attachment, path: string):
  Promise<number> {
  const data = await readAttachment(agent, attachment);
  const partial = `${path}.part`;
  try {
    const file = await open(partial, 'w');
    try {
      await file.writeFile(data);
    } finally {
      await file.close();
    }
    await rename(partial, path);
  } finally {
    await rm(partial, { force: true });
  }
  return data.length;
}
