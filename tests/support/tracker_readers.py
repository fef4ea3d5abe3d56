"""Read what the trackers wrote with each one's own reader: TensorBoard's event accumulator,
MLflow's client, and W&B's record protobufs for an offline run's `.wandb` log (and the table
files its records name)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

Series = dict[str, list[tuple[int, float]]]  # name -> [(step, value)], as written
Table = list[dict[str, object]]  # rows by column name, in the order written

# A `.wandb` file is a header, then 32 KiB blocks of chunks (crc32, length, type), as in a
# LevelDB log; a record is one FULL chunk or FIRST, MIDDLE..., LAST. W&B ships no reader for
# it in Python any more; the records themselves are parsed with its own protobuf classes.
_HEADER, _BLOCK, _CHUNK = 7, 32 * 1024, 7
_FULL, _LAST = 1, 4


def tensorboard_series(logdir: Path) -> Series:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logdir))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def tensorboard_texts(logdir: Path, tag: str) -> list[tuple[int, str]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logdir))
    events.Reload()
    found = events.Tags()["tensors"]
    name = f"{tag}/text_summary"
    if name not in found:
        return []
    return [(e.step, e.tensor_proto.string_val[0].decode()) for e in events.Tensors(name)]


def mlflow_tables(tracking_uri: str, job_id: str, directory: str, into: Path) -> Table:
    """Every JSON table artifact under `directory` of the job's run, in name order."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name("loom")
    assert experiment is not None
    [run] = client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.loom_job_id = '{job_id}'"
    )
    rows: Table = []
    for artifact in sorted(client.list_artifacts(run.info.run_id, directory), key=lambda a: a.path):
        local = client.download_artifacts(run.info.run_id, artifact.path, str(into))
        table = json.loads(Path(local).read_text())
        rows += [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
    return rows


def wandb_tables(wandb_dir: Path, job_id: str, key: str) -> Table:
    """The rows of every W&B Table the job's offline runs logged under `key`."""
    rows: Table = []
    for run_dir, row in _history(wandb_dir, job_id):
        if row.get(f"{key}/_type") == "table-file":  # a logged object's fields, flattened
            table = json.loads((run_dir / "files" / str(row[f"{key}/path"])).read_text())
            rows += [dict(zip(table["columns"], r, strict=True)) for r in table["data"]]
    return rows


def mlflow_series(tracking_uri: str, job_id: str) -> Series:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name("loom")
    assert experiment is not None
    [run] = client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.loom_job_id = '{job_id}'"
    )
    return {
        key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
        for key in run.data.metrics
    }


def wandb_series(wandb_dir: Path, job_id: str) -> Series:
    """Every metric of the job's offline runs, against the step metric it was defined on."""
    series: Series = {}
    for _, row in _history(wandb_dir, job_id):
        steps = {k: v for k, v in row.items() if k == "step" or k.endswith("/step")}
        objects = {k.removesuffix("/_type") for k in row if k.endswith("/_type")}
        for name, value in row.items():
            if name.startswith("_") or name in steps or name.rpartition("/")[0] in objects:
                continue  # W&B's own fields, step metrics, a table's fields
            phase = name.partition("/")[0] if "/" in name else ""
            step = steps[f"{phase}/step" if f"{phase}/step" in steps else "step"]
            series.setdefault(name, []).append((int(step), float(value)))
    return series


def _history(wandb_dir: Path, job_id: str) -> list[tuple[Path, dict[str, object]]]:
    """(run directory, row) of every history record of the job's offline runs."""
    from wandb.proto import wandb_internal_pb2

    rows = []
    for path in sorted(wandb_dir.glob(f"offline-run-*-{job_id}/run-{job_id}.wandb")):
        for data in _records(path.read_bytes()):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(data)
            if record.WhichOneof("record_type") == "history":
                rows.append(
                    (
                        path.parent,
                        {
                            item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.history.item
                        },
                    )
                )
    return rows


def _records(raw: bytes) -> list[bytes]:
    records, pending, pos = [], b"", _HEADER
    while pos + _CHUNK <= len(raw):
        left = _BLOCK - pos % _BLOCK
        if left < _CHUNK:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos : pos + _CHUNK])
        if kind == 0:
            pos += left
            continue
        pending += raw[pos + _CHUNK : pos + _CHUNK + length]
        pos += _CHUNK + length
        if kind in (_FULL, _LAST):
            records.append(pending)
            pending = b""
    return records
