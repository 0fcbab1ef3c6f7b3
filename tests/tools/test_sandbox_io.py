"""The sandbox's byte-level helpers: the capped output buffer and the control-pipe framing (no processes)."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentcredit.tools.sandbox.framing import HEADER, FrameReader, OutputCapture, encode_frame


def frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


# ---- OutputCapture ----------------------------------------------------------------------------------------------


def test_capture_keeps_everything_under_the_cap():
    capture = OutputCapture(64)
    capture.feed(b"hello ")
    capture.feed(b"world\n")
    assert capture.text() == "hello world\n"
    assert capture.total == 12
    assert not capture.truncated


def test_capture_cut_by_hand():
    # cap 64 -> head 48 bytes (3/4), tail 16 bytes; 100 bytes in -> 36 omitted.
    data = bytes(ord("a") + i % 26 for i in range(100))
    capture = OutputCapture(64)
    for i in range(0, 100, 7):  # chunking must not matter
        capture.feed(data[i : i + 7])
    assert capture.total == 100 and capture.truncated
    text = capture.text()
    assert text.startswith(data[:48].decode())
    assert text.endswith(data[-16:].decode())
    assert "[... output truncated: 36 of 100 bytes omitted ...]" in text


def test_capture_replaces_invalid_utf8_and_nul():
    capture = OutputCapture(64)
    capture.feed(b"a\x00b\xff\xfec")
    assert capture.text() == "a\ufffdb\ufffd\ufffdc"


def test_capture_rejects_tiny_cap():
    with pytest.raises(ValueError, match="at least 64"):
        OutputCapture(10)


@given(st.lists(st.binary(max_size=200), max_size=30), st.integers(min_value=64, max_value=600))
def test_capture_property_head_and_tail_are_exact(chunks, cap):
    capture = OutputCapture(cap)
    for chunk in chunks:
        capture.feed(chunk)
    data = b"".join(chunks)
    assert capture.total == len(data)
    assert len(capture.head) + len(capture.tail) <= cap  # memory is bounded whatever was fed
    if len(data) <= cap:
        assert bytes(capture.head + capture.tail) == data and not capture.truncated
    else:
        assert bytes(capture.head) == data[: capture.head_cap]
        assert bytes(capture.tail) == data[len(data) - capture.tail_cap :]
        assert capture.truncated


# ---- FrameReader ------------------------------------------------------------------------------------------------


def test_frames_round_trip_across_reads():
    messages = [{"type": "search", "query": "é 中文", "k": 3}, {"type": "ready", "network": "namespace"}]
    stream = b"".join(encode_frame(m) for m in messages)
    reader = FrameReader(max_frame=1024)
    got = []
    for i in range(len(stream)):  # one byte at a time: the worst split
        got += reader.feed(stream[i : i + 1])
    assert got == messages and reader.error is None


@given(
    st.lists(
        st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=20), max_size=4), max_size=6
    ),
    st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=20),
)
def test_frames_property_any_split_gives_the_same_messages(messages, cuts):
    stream = b"".join(encode_frame(m) for m in messages)
    reader = FrameReader(max_frame=1 << 16)
    got, pos, i = [], 0, 0
    while pos < len(stream):
        step = cuts[i % len(cuts)]
        got += reader.feed(stream[pos : pos + step])
        pos, i = pos + step, i + 1
    assert got == messages and reader.error is None


def test_garbage_after_a_valid_frame_keeps_the_frame_and_stops():
    reader = FrameReader(max_frame=1024)
    got = reader.feed(encode_frame({"type": "ready"}) + frame(b"not json"))
    assert got == [{"type": "ready"}]
    assert reader.error is not None and "not JSON" in reader.error
    assert reader.feed(encode_frame({"type": "search"})) == []  # stopped for good


def test_oversize_frame_is_refused_before_its_bytes_arrive():
    reader = FrameReader(max_frame=1024)
    assert reader.feed(HEADER.pack(0xFFFFFFFF)) == []
    assert "exceeds the 1024-byte limit" in (reader.error or "")


@pytest.mark.parametrize(
    ("payload", "why"), [(b"[1, 2]", "JSON list"), (b'"text"', "JSON str"), (b"\xff\xfe", "not JSON")]
)
def test_non_object_frames_are_protocol_errors(payload, why):
    reader = FrameReader(max_frame=1024)
    reader.feed(frame(payload))
    assert why in (reader.error or "")


def test_encode_frame_is_length_prefixed_json():
    data = encode_frame({"a": 1})
    (size,) = struct.unpack(">I", data[:4])
    assert size == len(data) - 4 and json.loads(data[4:]) == {"a": 1}
