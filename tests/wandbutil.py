"""Read what an offline wandb run (WANDB_MODE=offline: wandb/offline-run-*/) holds, without a server."""

import json
import struct
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK, HEADER = 32768, 7  # the .wandb file: leveldb-log framing, 32 KiB blocks, a 7-byte header per chunk


def records(path):
    """The wandb_internal_pb2.Record entries of a run-*.wandb file, in order (up to a record cut short)."""
    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a .wandb file")
    pos, pending = 7, b""  # after the file header: ":W&B", a 2-byte magic, a version byte
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the rest of a block too short for a header: padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if kind == 0:  # zero padding to the end of the block
            pos += left
            continue
        if pos + HEADER + length > len(data):
            break
        chunk, pos = data[pos + HEADER : pos + HEADER + length], pos + HEADER + length
        pending = chunk if kind in (1, 2) else pending + chunk  # 1 whole, 2 first, 3 middle, 4 last
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def offline_run(folder):
    """{"id", "name", "group", "tags", "job_type", "config", "rows" (history rows), "videos" [(step key value, path)],
    "files" (paths under files/), "exit_code"} of one offline run folder."""
    (wandb_file,) = Path(folder).glob("run-*.wandb")
    run = {"id": None, "name": None, "group": None, "tags": [], "job_type": None, "config": {}, "rows": [], "exit_code": None}
    for record in records(wandb_file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            r = record.run
            run.update(id=r.run_id, name=r.display_name, group=r.run_group or None, tags=list(r.tags), job_type=r.job_type)
            run["config"].update({item.key: json.loads(item.value_json) for item in r.config.update})
        elif kind == "config":
            run["config"].update({item.key: json.loads(item.value_json) for item in record.config.update})
        elif kind == "history":
            row = {}
            for item in record.history.item:  # media come as nested keys: ("videos", "path"), ("videos", "_type"), ...
                keys, into = list(item.nested_key) or [item.key], row
                for key in keys[:-1]:
                    into = into.setdefault(key, {})
                into[keys[-1]] = json.loads(item.value_json)
            run["rows"].append(row)
        elif kind == "exit":
            run["exit_code"] = record.exit.exit_code
    run["videos"] = [row for row in run["rows"] if isinstance(row.get("videos"), dict)]
    files = Path(folder, "files")
    run["files"] = sorted(str(p.relative_to(files)) for p in files.rglob("*") if p.is_file() or p.is_symlink())
    return run


def offline_runs(cwd):
    """Every offline run under cwd/wandb, oldest first."""
    return [offline_run(f) for f in sorted(Path(cwd, "wandb").glob("offline-run-*"))]  # named by their start time
