"""Samples pushed into a real Prometheus through its remote-write receiver: the backtest's loader.

Prometheus 2.42 takes remote-write requests on /api/v1/write when started with
`--web.enable-remote-write-receiver`, and appends them to its head as a scrape would; its
admin API's snapshot then writes the head out as a TSDB block. For the backtest's runs this
takes half the CPU time of writing OpenMetrics text and parsing it with promtool
(benchmarks/bench_loader.py), and the block holds the same samples (tests/test_remote_write.py
compares the two, sample by sample).

A request is a protobuf `prometheus.WriteRequest` (prompb/remote.proto, remote-write 1.0):

    WriteRequest { repeated TimeSeries timeseries = 1; }
    TimeSeries   { repeated Label labels = 1; repeated Sample samples = 2; }
    Label        { string name = 1; string value = 2; }
    Sample       { double value = 1; int64 timestamp = 2; }   // ms

encoded here by hand: three small messages, and a series' samples laid out by numpy at once
(a protobuf library would build an object per sample). The body is snappy's block format
holding one literal: a valid snappy block that a decoder copies out, as compressing it would
buy nothing on loopback. Labels are sorted by name, as the protocol asks.

Not a remote-write client for live data: no retries, no queue, no sharding.

    >>> body = write_request([("up", [("instance", "a"), ("job", "trainer")], [1.0], [1767225600000])])
    >>> push("http://127.0.0.1:9090", body)
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import numpy as np
import requests

PUSH_TIMEOUT_S = 300  # a request of the backtest's (25 runs, 2 to 20 MB) takes well under a second


def _varint(n: int) -> bytes:
    """A non-negative integer, 7 bits a byte, low bits first (an int64 goes as its uint64)."""
    if n < 0:
        raise ValueError(f"remote_write: a varint of {n}: pass a negative int64 as its two's complement")
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        if not n:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2): a string or an embedded message."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _samples(values: list[float], stamps_ms: list[int]) -> tuple[bytes, int]:
    """Every sample of a series as TimeSeries field 2, in order; a NaN value is no sample."""
    v = np.asarray(values, dtype=np.float64)
    t = np.asarray(stamps_ms, dtype=np.int64)
    if v.shape != t.shape:
        raise ValueError(f"remote_write: {len(v)} values for {len(t)} timestamps")
    keep = ~np.isnan(v)
    v, t = v[keep], t[keep].astype(np.uint64)  # an int64 varint is its two's complement's
    if not len(v):
        return b"", 0
    width = len(_varint(int(t.min())))  # the same for every stamp when the largest has as many bytes
    if len(_varint(int(t.max()))) != width:  # stamps straddling a varint length: not the lab clock's
        return b"".join(_one(x, s) for x, s in zip(v.tolist(), t.tolist(), strict=True)), len(v)
    layout = np.dtype([("tag", "u1"), ("size", "u1"), ("vtag", "u1"), ("value", "<f8"), ("ttag", "u1"),
                       ("stamp", "u1", (width,))])  # fmt: skip
    out = np.empty(len(v), layout)
    out["tag"], out["size"], out["vtag"], out["ttag"] = 0x12, 10 + width, 0x09, 0x10
    out["value"] = v
    for k in range(width):
        out["stamp"][:, k] = ((t >> np.uint64(7 * k)) & np.uint64(0x7F)) | np.uint64(0x80 if k < width - 1 else 0)
    return out.tobytes(), len(v)


def _one(value: float, stamp: int) -> bytes:
    """One Sample message's field, the slow way."""
    return _field(2, b"\x09" + struct.pack("<d", value) + b"\x10" + _varint(stamp))


def write_request(series: Iterable[tuple[str, list[tuple[str, str]], list[float], list[int]]]) -> tuple[bytes, int]:
    """(the snappy-framed WriteRequest, its sample count) for (name, labels, values, stamps in
    ms) of each series; NaN values are left out."""
    parts, count = [], 0
    for name, labels, values, stamps in series:
        pairs = sorted([("__name__", name), *labels])
        if len({k for k, _ in pairs}) != len(pairs):
            raise ValueError(f"remote_write: {name} names a label twice: {labels}")
        head = b"".join(_field(1, _field(1, k.encode()) + _field(2, v.encode())) for k, v in pairs)
        samples, n = _samples(values, stamps)
        if n:
            parts.append(_field(1, head + samples))
            count += n
    return snappy_literal(b"".join(parts)), count


def snappy_literal(data: bytes) -> bytes:
    """data as a snappy block (github.com/google/snappy, format_description.txt): its length as
    a varint, then all of it as one literal, whose length takes 4 bytes (tag 63)."""
    if len(data) >= 2**32:
        raise ValueError(f"remote_write: a request of {len(data)} bytes is more than snappy frames")
    out = [_varint(len(data))]
    if data:
        out += [bytes([63 << 2]) + (len(data) - 1).to_bytes(4, "little"), data]
    return b"".join(out)


def push(base: str, body: bytes) -> None:
    """POST one request to a Prometheus at base; its refusal, with Prometheus's reason, raises."""
    resp = requests.post(
        f"{base}/api/v1/write",
        data=body,
        headers={
            "Content-Encoding": "snappy",
            "Content-Type": "application/x-protobuf",
            "X-Prometheus-Remote-Write-Version": "0.1.0",
        },
        timeout=PUSH_TIMEOUT_S,
    )
    if resp.status_code // 100 != 2:
        raise RuntimeError(f"Prometheus refused the runs' samples ({resp.status_code}): {resp.text.strip()[:300]}")
