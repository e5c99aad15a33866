"""Files by reference (docs/protocol.md §17): upload a file of any size to the files service,
put the attachment it returns on a send or a call, and read the attachments of the messages
delivered to you. The bytes are stored once, however many agents read or forward them.

    attachment = await agent.upload_file("report.pdf", "application/pdf")
    await agent.send("reviewer", "the report, attached", attachments=[attachment])
    # the reviewer:
    for attachment in message.attachments:
        await agent.save_attachment(attachment, f"inbox/{attachment.name}")
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, BinaryIO

from nats.errors import NoRespondersError, TimeoutError as NatsTimeout

from . import wire
from .errors import SwitchboardError, Unavailable

if TYPE_CHECKING:
    from .agent import Agent

#: Headers of an upload's chunk, and of a read's chunks (§17).
HEADER_FILE_ID, HEADER_FILE_OFFSET = "Switchboard-File-Id", "Switchboard-File-Offset"
#: Attempts of one chunk or read while no replica answers or its reply is lost.
ATTEMPTS = 6
#: Seconds one chunk's or read's reply may take.
CHUNK_TIMEOUT_S = 10.0
#: Chunks one read asks for (the service answers with at most 16).
READ_CHUNKS = 16


def _decode(subject: str, msg: Any) -> Any:
    """A reply's JSON, or its error reply raised (the agent's own decoding, §2)."""
    from .agent import _decode as decode
    return decode(subject, msg)


async def upload(agent: "Agent", name: str, media_type: str, source: BinaryIO | bytes,
                 size: int | None = None) -> wire.Attachment:
    """Uploads ``source`` (bytes, or a binary file open for reading: it is read twice, once
    for its SHA-256, then in chunks) as ``name`` of ``media_type``; returns its attachment."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        size, digest = len(data), hashlib.sha256(data).hexdigest()
        read = _reader(data)
    else:
        start = source.tell()
        hasher, size = hashlib.sha256(), 0
        while block := source.read(1 << 20):
            hasher.update(block)
            size += len(block)
        digest = hasher.hexdigest()
        source.seek(start)
        read = source.read
    started = await agent.request(f"agent.files.upload.{agent.id}", {
        "name": name, "media_type": media_type, "size": size, "sha256": digest,
        "upload_id": str(uuid.uuid4()),
    })
    file_id, chunk = started["file_id"], started["chunk_bytes"]
    if size == 0:
        return wire.parse(wire.FileView, await agent.request(
            f"agent.files.stat.{agent.id}", {"file_id": file_id})).attachment
    offset = 0
    while True:
        part = read(min(chunk, size - offset))
        reply = await _send_chunk(agent, file_id, offset, part)
        if reply.get("attachment"):
            return wire.parse(wire.Attachment, reply["attachment"])
        if reply["received"] != offset + len(part):
            raise Unavailable("upload", 503,
                              f"the service stands at {reply['received']} after the chunk at "
                              f"{offset}")
        offset = reply["received"]


def _reader(data: bytes):
    view, position = memoryview(data), 0

    def read(n: int) -> bytes:
        nonlocal position
        part = bytes(view[position:position + n])
        position += len(part)
        return part
    return read


async def _send_chunk(agent: "Agent", file_id: str, offset: int, part: bytes) -> Mapping:
    """One chunk, sent again while no replica answers or its reply is lost (the service
    stores a chunk once)."""
    subject = f"agent.files.chunk.{agent.id}"
    headers = {HEADER_FILE_ID: file_id, HEADER_FILE_OFFSET: str(offset)}
    pause = 0.1
    for attempt in range(1, ATTEMPTS + 1):
        try:
            msg = await agent.nc.request(subject, part, timeout=CHUNK_TIMEOUT_S,
                                         headers=headers)
            return _decode(subject, msg)
        except (NoRespondersError, NatsTimeout, asyncio.TimeoutError):
            if attempt == ATTEMPTS:
                raise Unavailable("request_timeout", 504,
                                  f"no reply on {subject} in time") from None
            await asyncio.sleep(pause)
            pause *= 2
    raise AssertionError("unreachable: the last attempt returns or raises")


async def read_chunks(agent: "Agent", file_id: str, offset: int,
                      after_seq: int | None) -> tuple[list[tuple[int, bytes]], Mapping]:
    """One read from ``offset``: its chunks (offset, bytes) and its end (``next_offset``,
    ``after_seq``, ``eof``). Sent again while no replica answers or a reply is lost."""
    subject = f"agent.files.read.{agent.id}"
    body: dict[str, Any] = {"file_id": file_id, "offset": offset, "chunks": READ_CHUNKS}
    if after_seq is not None:
        body["after_seq"] = after_seq
    pause = 0.1
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return await _read_once(agent, subject, json.dumps(body).encode())
        except Unavailable:
            if attempt == ATTEMPTS:
                raise
            await asyncio.sleep(pause)
            pause *= 2
    raise AssertionError("unreachable: the last attempt returns or raises")


async def _read_once(agent: "Agent", subject: str,
                     payload: bytes) -> tuple[list[tuple[int, bytes]], Mapping]:
    nc = agent.nc
    inbox = nc.new_inbox()
    replies: asyncio.Queue = asyncio.Queue()
    sub = await nc.subscribe(inbox, cb=replies.put)
    try:
        await nc.publish(subject, payload, reply=inbox)
        chunks: list[tuple[int, bytes]] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CHUNK_TIMEOUT_S
        while True:
            try:
                msg = await asyncio.wait_for(replies.get(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                raise Unavailable("request_timeout", 504,
                                  f"no reply on {subject} in time") from None
            headers = msg.headers or {}
            if headers.get("Status") == "503":
                raise Unavailable("no_responders", 503, f"no service answers on {subject}")
            if HEADER_FILE_OFFSET in headers:
                chunks.append((int(headers[HEADER_FILE_OFFSET]), msg.data))
                continue
            return chunks, _decode(subject, msg)
    finally:
        await sub.unsubscribe()


async def download(agent: "Agent", attachment: Mapping, out: BinaryIO) -> int:
    """Writes the file of ``attachment`` to ``out``, checking its size and SHA-256 as the
    bytes come; returns the bytes written. ``SwitchboardError`` (``not_found``) when the file
    is not yours to read."""
    hasher, offset, after_seq = hashlib.sha256(), 0, None
    while True:
        chunks, end = await read_chunks(agent, attachment["ref"], offset, after_seq)
        for at, data in chunks:
            if at != offset:
                raise SwitchboardError("internal", 500, "a chunk out of order")
            hasher.update(data)
            out.write(data)
            offset += len(data)
        after_seq = end.get("after_seq")
        if end["eof"]:
            break
    if offset != attachment["size"] or hasher.hexdigest() != attachment["sha256"]:
        raise SwitchboardError("internal", 500,
                               "the bytes read do not match the attachment's size and sha256")
    return offset


async def save(agent: "Agent", attachment: Mapping, path: str | os.PathLike[str]) -> int:
    """:func:`download` into the file at ``path`` (written whole or not at all: a partial
    download is removed)."""
    partial = f"{os.fspath(path)}.part"
    try:
        with open(partial, "wb") as out:
            written = await download(agent, attachment, out)
        os.replace(partial, path)
        return written
    finally:
        if os.path.exists(partial):
            os.remove(partial)
