"""Reading back what an offline W&B run wrote: the records of its ``run-<id>.wandb`` file.

The file is W&B's transaction log: a 7-byte header (``:W&B``, a magic number,
a version) and then LevelDB's log format (blocks of 32 KiB; each chunk a
CRC32C, a little-endian length and a type: full, first, middle or last) whose
payloads are wandb's own protobuf ``Record`` messages. wandb 0.31 ships no
reader of its own, so the test reads the format with wandb's message class.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

from attrs import frozen

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_records(path: Path) -> list[Any]:
    """The ``Record`` messages of a ``.wandb`` file, in order."""
    from wandb.proto.wandb_internal_pb2 import Record

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B transaction log ({data[:7]!r})"
    records, parts, position = [], [], HEADER
    while position + HEADER <= len(data):
        left = BLOCK - position % BLOCK
        if left < HEADER:  # a block's tail too short for a chunk header is padding
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + HEADER])
        payload = data[position + HEADER : position + HEADER + length]
        position += HEADER + length
        if kind not in (FULL, FIRST, MIDDLE, LAST):
            continue
        parts.append(payload)
        if kind in (FULL, LAST):
            record = Record()
            record.ParseFromString(b"".join(parts))
            records.append(record)
            parts = []
    return records


@frozen
class OfflineRun:
    """One offline run directory's id, project, name, config and history."""

    directory: Path
    run_id: str
    project: str
    name: str
    config: dict[str, Any]
    history: list[dict[str, float]]  # one row per step: {"step": N, key: value, ...}


def finished_records(path: Path, timeout: float = 30.0) -> list[Any]:
    """`read_records` once the log ends with the run's exit record: wandb's service process
    writes the last records a moment after ``run.finish()`` has returned."""
    deadline = time.monotonic() + timeout
    while True:
        records = read_records(path)
        if records and records[-1].WhichOneof("record_type") == "exit":
            return records
        assert time.monotonic() < deadline, f"{path}: no exit record after {timeout} s"
        time.sleep(0.1)


def offline_runs(run_dir: Path) -> list[OfflineRun]:
    """Every ``run_dir/wandb/offline-run-*`` directory, oldest first."""
    runs = []
    for directory in sorted((run_dir / "wandb").glob("offline-run-*")):
        (log,) = directory.glob("run-*.wandb")
        run_id = project = name = ""
        config: dict[str, Any] = {}
        history = []
        for record in finished_records(log):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run = record.run  # a later run record (an update) may leave fields empty
                run_id = run.run_id or run_id
                project = run.project or project
                name = run.display_name or name
                config.update(_items(run.config.update))
            elif kind == "config":
                config.update(_items(record.config.update))
            elif kind == "history":
                row = {"step": record.history.step.num}
                for key, value in _items(record.history.item).items():
                    if not key.startswith("_"):
                        row[key] = value
                history.append(row)
        config.pop("_wandb", None)
        runs.append(OfflineRun(directory, run_id, project, name, config, history))
    return runs


def _items(items: Any) -> dict[str, Any]:
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}
