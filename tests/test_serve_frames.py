"""The serving process's frame reader: many pipelined frames per socket read, frames split across
reads, and a stream that ends inside a frame or announces one over the limit is a ProtocolError."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from asyncgraph.errors import ProtocolError
from asyncgraph.protocol.codec import encode_frame_bytes
from asyncgraph.serve.wire import FrameReader


def _reader(chunks: list[bytes]) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    for chunk in chunks:
        reader.feed_data(chunk)
    reader.feed_eof()
    return reader


async def _all(reader: asyncio.StreamReader, max_size: int = 1 << 20) -> list[object]:
    frames = FrameReader(reader, max_size)
    out = []
    while (msg := await frames.next()) is not None:
        out.append(msg)
    return out


@pytest.mark.asyncio
async def test_pipelined_and_split_frames_come_out_whole_and_in_order() -> None:
    msgs = [{"op": "infer", "id": i, "nodes": np.arange(i + 1, dtype=np.int64)} for i in range(50)]
    stream = b"".join(encode_frame_bytes(m) for m in msgs)
    big = {"op": "infer", "id": 99, "nodes": np.arange(40_000, dtype=np.int64)}  # several reads
    stream += encode_frame_bytes(big)
    for chunking in (len(stream), 1, 7, 4096):
        chunks = [stream[i : i + chunking] for i in range(0, len(stream), chunking)]
        got = await _all(_reader(chunks))
        assert [m["id"] for m in got] == [*range(50), 99]  # type: ignore[index]
        for m, want in zip(got, [*msgs, big], strict=True):
            np.testing.assert_array_equal(m["nodes"], want["nodes"])  # type: ignore[index]


@pytest.mark.asyncio
async def test_a_stream_ending_inside_a_frame_or_over_the_limit_is_a_protocol_error() -> None:
    frame = encode_frame_bytes({"op": "meta", "id": 1})
    with pytest.raises(ProtocolError, match="length"):
        await _all(_reader([frame[:2]]))
    with pytest.raises(ProtocolError, match="inside a frame"):
        await _all(_reader([frame + frame[:-1]]))
    with pytest.raises(ProtocolError, match="over the limit"):
        await _all(_reader([frame]), max_size=4)
    assert await _all(_reader([])) == []
