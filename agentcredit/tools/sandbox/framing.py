"""Byte-level helpers of the sandbox's parent side: the capped output buffer and the control-pipe framing.

Both take bytes from an untrusted program, so both are bounded in memory whatever the program writes.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

HEADER = struct.Struct(">I")  # every control frame: a 4-byte big-endian length, then that many bytes of JSON


def encode_frame(message: dict[str, Any]) -> bytes:
    payload = json.dumps(message).encode()
    return HEADER.pack(len(payload)) + payload


class ProtocolError(ValueError):
    """The program broke the control-pipe protocol (garbage, oversize frame, not a JSON object)."""


@dataclass
class FrameReader:
    """Splits the control pipe's byte stream into JSON objects and stops for good at the first garbage.

    ``feed`` returns the frames completed so far; after garbage it sets ``error`` and returns only the frames
    that came before it (so a valid message followed by garbage in the same read is not lost). The buffer never
    holds more than one frame plus one read: frames are taken out as soon as they are complete, and a declared
    length above ``max_frame`` is refused before its bytes are waited for.
    """

    max_frame: int
    error: str | None = None
    _buffer: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        if self.error is not None:
            return []
        self._buffer += data
        frames: list[dict[str, Any]] = []
        try:
            self._split(frames)
        except ProtocolError as exc:
            self.error = str(exc)
            self._buffer.clear()
        return frames

    def _split(self, frames: list[dict[str, Any]]) -> None:
        while len(self._buffer) >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buffer)
            if size > self.max_frame:
                raise ProtocolError(f"control frame of {size} bytes exceeds the {self.max_frame}-byte limit")
            if len(self._buffer) < HEADER.size + size:
                break
            payload = bytes(self._buffer[HEADER.size : HEADER.size + size])
            del self._buffer[: HEADER.size + size]
            try:
                message = json.loads(payload)
            except ValueError as exc:  # UnicodeDecodeError is a ValueError too
                raise ProtocolError(f"control frame is not JSON: {exc}") from None
            if not isinstance(message, dict):
                raise ProtocolError(f"control frame is a JSON {type(message).__name__}, not an object")
            frames.append(message)


class OutputCapture:
    """Keeps the head and the tail of a byte stream within ``cap`` bytes and counts everything seen.

    The head shows what the program printed first; the tail keeps the end, where a traceback or a final result
    usually is. What is dropped in between is replaced by a visible marker saying how many bytes went missing.
    """

    def __init__(self, cap: int):
        if cap < 64:
            raise ValueError(f"output cap must be at least 64 bytes, got {cap}")
        self.cap = cap
        self.head_cap = cap * 3 // 4
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data[-self.tail_cap :]
            if len(self.tail) > self.tail_cap:
                del self.tail[: len(self.tail) - self.tail_cap]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def text(self) -> str:
        """Decoded output; bytes that are not UTF-8 become U+FFFD, and so do NUL bytes."""
        head = _decode(bytes(self.head))
        if not self.truncated:
            return head + _decode(bytes(self.tail))
        omitted = self.total - len(self.head) - len(self.tail)
        marker = f"\n[... output truncated: {omitted} of {self.total} bytes omitted ...]\n"
        return head + marker + _decode(bytes(self.tail))


def _decode(data: bytes) -> str:
    # NUL is replaced too: many consumers (C strings, some tokenizers, terminals) choke on it.
    return data.decode("utf-8", "replace").replace("\x00", "\ufffd")
