"""Read a W&B ``.wandb`` transaction log back (the Python reader left W&B in 0.2x).

Used by ``advmon report``/``compare`` to read an offline run directory, and by
the tests to check what the W&B sink wrote.

Format: a 7-byte header (``:W&B``, magic 0xBEE1 little-endian, version 0), then
LevelDB-log records in 32 KiB blocks: header crc32 (u32, over the type byte and
the payload), length (u16), type (u8: FULL=1, FIRST=2, MIDDLE=3, LAST=4); each
payload is a ``wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

BLOCK = 32 * 1024
HEADER = 7


class WandbFileError(ValueError):
    """The file is not a W&B transaction log, or it is damaged."""


def read_records(path: Path) -> list:
    """Every ``wandb_internal_pb2.Record`` of a ``.wandb`` file, in order.

    A record cut short at the end (a run still writing, or killed) is left out.
    """
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    if data[:4] != b":W&B" or len(data) < HEADER:
        raise WandbFileError(f"{path} is not a W&B run file (it does not start with ':W&B')")
    magic, version = struct.unpack("<HB", data[4:7])
    if (magic, version) != (0xBEE1, 0):
        raise WandbFileError(f"{path}: unknown W&B file format (magic {magic:#x}, version {version})")
    payloads, pending, pos = [], b"", HEADER
    while pos + HEADER <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < HEADER:
            pos += left_in_block  # trailer padding
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if (crc, length, kind) == (0, 0, 0):
            pos += left_in_block
            continue
        chunk = data[pos + HEADER : pos + HEADER + length]
        if len(chunk) < length:
            break  # the last record is still being written
        if zlib.crc32(bytes([kind]) + chunk) != crc:
            raise WandbFileError(f"{path}: bad checksum at byte {pos}")
        pos += HEADER + length
        if kind == 1:
            payloads.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            payloads.append(pending + chunk)
    records = []
    for payload in payloads:
        record = wandb_internal_pb2.Record()
        try:
            record.ParseFromString(payload)
        except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError, whatever its module
            raise WandbFileError(f"{path}: a record does not parse ({exc})") from None
        records.append(record)
    return records


def history_rows(path: Path) -> list[dict]:
    rows = []
    for record in read_records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item})
    return rows


def metric_definitions(path: Path) -> list:
    return [r.metric for r in read_records(path) if r.WhichOneof("record_type") == "metric"]


def summaries(path: Path) -> dict:
    merged: dict = {}
    for record in read_records(path):
        if record.WhichOneof("record_type") == "summary":
            for item in record.summary.update:
                merged[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return merged
