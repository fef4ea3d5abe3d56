"""What modelstate's staged publish costs beyond making the bytes durable once: the store's own
`ModelStore.publish` of a version written into its staging area (hash and check every file,
sync the new ones, register blobs, number the version, move `latest`, build the version
directory, commit), on SQLite and on PostgreSQL, against the raw cost measured in the same run
and on the same files: sha256 of each file, fsync of each, fsync of the directory. Writes
bench/results/store_publish.md.

Each version is laid out like a trainer's full-weights save: a weight file of `--weights-mb`
random bytes (new content every time) beside the small files a Hugging Face directory carries
(config, generation config, tokenizer: the same content every time, as in training). Arms
alternate repeat by repeat, so drift hits both alike.

A second table: the store's whole share of `POST /v1/versions` for the tiny model's size
(`link_pending` + `publish`) over a run of `--run-versions` publishes, as a fast training loop
makes them, now and before issue 38: each publish then looked at every pending directory of
the last ten minutes (and every file in them) for expired ones; now that happens once a minute.
Both arms run in the same process, alternating publish by publish, each on a store of its own.

    .venv/bin/python -m bench.store_publish [--repeats 40] [--weights-mb 1 100]
        [--run-versions 300]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from modelstate.app import ALEMBIC_DIR, VERSION_TABLE
from modelstate.blobstore import (
    PENDING_PREFIX,
    PENDING_SWEEP_S,
    PENDING_TTL_S,
    BlobStore,
    is_older_than,
)
from modelstate.schemas import PublishRequest, VersionKind
from modelstate.store import ModelStore
from services.common.db import make_engine, make_sessionmaker, migrate, scratch_database
from services.common.files import fsync_path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "store_publish.md"
PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
MiB = 1 << 20
# The small files of a Hugging Face directory, unchanged from one save to the next.
CONSTANT_FILES = {
    "config.json": 800,
    "generation_config.json": 60,
    "tokenizer.json": 7000,
    "tokenizer_config.json": 320,
    "chat_template.jinja": 650,
}


@contextmanager
def database(backend: str, work: Path) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{work / 'modelstate.db'}"
        return
    with scratch_database(PG_ADMIN_URL, "loom_bench") as url:
        yield url


def write_version(directory: Path, weights_bytes: int, constants: dict[str, bytes]) -> None:
    """What a trainer leaves in a staging directory; flushed to the page cache, not synced."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "model.safetensors").write_bytes(os.urandom(weights_bytes))
    for name, data in constants.items():
        (directory / name).write_bytes(data)


def raw_durable(directory: Path) -> float:
    """The bytes verified and made durable once: sha256 and fsync of each file, then the
    directory's entries."""
    start = time.perf_counter()
    for path in sorted(directory.iterdir()):
        with open(path, "rb") as source:
            hashlib.file_digest(source, "sha256")
            os.fsync(source.fileno())
    fsync_path(directory)
    return time.perf_counter() - start


def measure(backend: str, weights_bytes: int, repeats: int, work: Path) -> dict[str, float]:
    constants = {name: os.urandom(size) for name, size in CONSTANT_FILES.items()}
    publish_s: list[float] = []
    raw_s: list[float] = []
    with database(backend, work) as url:
        migrate(url, ALEMBIC_DIR, VERSION_TABLE)
        engine = make_engine(url)
        store = ModelStore(make_sessionmaker(engine), BlobStore(work / "blobs", 1 << 40))
        for repeat in range(repeats + 1):  # the first publish warms connections: not counted
            name = store.blobs.new_staging_name()
            write_version(store.blobs.staging / name, weights_bytes, constants)
            request = PublishRequest(
                job_id="bench", kind=VersionKind.full, base_model="m", step=repeat, staged=name
            )
            start = time.perf_counter()
            store.publish(request)
            elapsed = time.perf_counter() - start
            raw_dir = work / "raw" / str(repeat)
            write_version(raw_dir, weights_bytes, constants)
            raw = raw_durable(raw_dir)
            shutil.rmtree(raw_dir)
            if repeat:
                publish_s.append(elapsed)
                raw_s.append(raw)
        engine.dispose()
    publish_p50, raw_p50 = statistics.median(publish_s), statistics.median(raw_s)
    return {
        "publish_p50": 1000 * publish_p50,
        "publish_p90": 1000 * statistics.quantiles(publish_s, n=10)[-1],
        "raw_p50": 1000 * raw_p50,
        "ratio": publish_p50 / raw_p50,
    }


def sweep_every_publish(blobs: BlobStore) -> None:
    """The pending sweep as `BlobStore.link_pending` made it before issue 38, at every call."""
    for old in blobs.tmp.glob(f"{PENDING_PREFIX}*"):
        if is_older_than(old, PENDING_TTL_S):
            shutil.rmtree(old, ignore_errors=True)


def measure_run(weights_bytes: int, versions: int, work: Path) -> dict[str, list[float]]:
    """Seconds of link_pending + publish for each publish of a run, by arm."""
    constants = {name: os.urandom(size) for name, size in CONSTANT_FILES.items()}
    stores, engines = {}, []
    for arm in ("before", "now"):
        url = f"sqlite:///{work / f'{arm}.db'}"
        migrate(url, ALEMBIC_DIR, VERSION_TABLE)
        engines.append(make_engine(url))
        stores[arm] = ModelStore(
            make_sessionmaker(engines[-1]), BlobStore(work / f"blobs-{arm}", 1 << 40)
        )
    times: dict[str, list[float]] = {arm: [] for arm in stores}
    for step in range(versions):
        for arm, store in stores.items():
            name = store.blobs.new_staging_name()
            write_version(store.blobs.staging / name, weights_bytes, constants)
            request = PublishRequest(
                job_id="bench", kind=VersionKind.full, base_model="m", step=step, staged=name
            )
            start = time.perf_counter()
            if arm == "before":
                sweep_every_publish(store.blobs)
            store.link_pending(request)
            store.publish(request)
            times[arm].append(time.perf_counter() - start)
    for engine in engines:
        engine.dispose()
    return times


def report_run(times: dict[str, list[float]], weights_bytes: int) -> str:
    versions = len(times["now"])
    parts = [
        (f"publishes 1-{versions // 10}", slice(0, versions // 10)),
        (
            f"publishes {versions - versions // 10 + 1}-{versions}",
            slice(versions - versions // 10, versions),
        ),
        (f"all {versions}", slice(0, versions)),
    ]
    lines = [
        "",
        f"## The store's share of a publish over a run of {versions} versions "
        f"({weights_bytes / MiB:.1f} MiB of weights, SQLite)",
        "",
        "`link_pending` + `publish`, as `POST /v1/versions` calls them (without HTTP). "
        "*before*: every publish first looks through the pending directories of the last "
        f"{PENDING_TTL_S / 60:.0f} minutes, as before issue 38; *now*: once every "
        f"{PENDING_SWEEP_S:.0f} s. Load average at the end: {os.getloadavg()[0]:.1f} (a shared "
        "machine: times are upper bounds).",
        "",
        "| publishes | before p50 ms | now p50 ms | before mean ms | now mean ms |",
        "|---|---|---|---|---|",
    ]
    for label, part in parts:
        before, now = times["before"][part], times["now"][part]
        lines.append(
            f"| {label} | {1000 * statistics.median(before):.1f} | "
            f"{1000 * statistics.median(now):.1f} | "
            f"{1000 * statistics.fmean(before):.1f} | "
            f"{1000 * statistics.fmean(now):.1f} |"
        )
    return "\n".join(lines) + "\n"


def report(rows: list[tuple[str, int, dict[str, float]]], repeats: int) -> str:
    lines = [
        f"# Staged publish vs the bytes made durable once ({repeats} repeats, "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC)",
        "",
        f"Machine: {os.cpu_count()} CPU cores; store and database on the same local disk. "
        "*publish*: `ModelStore.publish` of a staged version (the trainer's same-host path, "
        "without HTTP). *raw*: sha256 + fsync of each of the same files and an fsync of their "
        "directory. Version: one weight file (new content each time) + "
        f"{len(CONSTANT_FILES)} small files of constant content. Ratio = publish p50 / raw p50.",
        "",
        "| database | weights MiB | publish p50 ms | publish p90 ms | raw p50 ms | ratio |",
        "|---|---|---|---|---|---|",
        *(
            f"| {backend} | {size / MiB:.0f} | {row['publish_p50']:.1f} | "
            f"{row['publish_p90']:.1f} | {row['raw_p50']:.1f} | {row['ratio']:.2f} |"
            for backend, size, row in rows
        ),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--weights-mb", type=float, nargs="+", default=[1, 100])
    parser.add_argument(
        "--databases", nargs="+", choices=["sqlite", "postgresql"], default=["sqlite", "postgresql"]
    )
    parser.add_argument("--run-versions", type=int, default=300)
    parser.add_argument(
        "--run-weights-mb", type=float, default=3.15, help="the tiny model's weight file"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    rows = []
    for backend in args.databases:
        for size_mb in args.weights_mb:
            with tempfile.TemporaryDirectory(prefix="loom-store-bench-") as temp:
                size = int(size_mb * MiB)
                rows.append((backend, size, measure(backend, size, args.repeats, Path(temp))))
                print(backend, size_mb, rows[-1][2], flush=True)
    table = report(rows, args.repeats)
    if args.run_versions:
        with tempfile.TemporaryDirectory(prefix="loom-store-bench-") as temp:
            size = int(args.run_weights_mb * MiB)
            table += report_run(measure_run(size, args.run_versions, Path(temp)), size)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table)
    print(table)


if __name__ == "__main__":
    main()
