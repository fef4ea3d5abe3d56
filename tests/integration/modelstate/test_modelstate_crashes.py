"""Killing the publisher or the store (SIGKILL) in the middle of publishing leaves no visible
partial version, and garbage collection reclaims everything the dead writer left behind.

The store and the publisher run as real processes; the publisher alternates uploads and
staged publishes of fresh content, and is killed at random moments, as is the store."""

from __future__ import annotations

import hashlib
import random
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from services.common.service_token import service_headers
from services.common.settings import LoomSettings
from tests.support.modelstate_process import StoreProcess

PUBLISHER = textwrap.dedent("""
    import asyncio, os, sys, tempfile
    from pathlib import Path
    from modelstate.client import ModelStateClient
    from modelstate.schemas import VersionKind, VersionMeta
    from services.common.settings import LoomSettings

    async def main(url: str, scratch: str, step: int) -> None:
        client = ModelStateClient.from_settings(LoomSettings(modelstate_url=url))
        while True:
            staged = await client.staging_dir() if step % 2 else None
            directory = staged or Path(tempfile.mkdtemp(dir=scratch))
            (directory / "model.safetensors").write_bytes(os.urandom(24 << 20))
            (directory / "config.json").write_text('{"step": %d}' % step)
            meta = VersionMeta(job_id="job", kind=VersionKind.full, base_model="m", step=step)
            try:
                await client.publish(meta, directory)
                print("published", step, flush=True)
            except Exception as exc:  # the store is being killed: keep going
                print("failed", step, repr(exc)[:200], flush=True)
                await asyncio.sleep(0.2)
            step += 1

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
""")


@pytest.fixture
def store(database_url: str, tmp_path: Path) -> Iterator[StoreProcess]:
    store = StoreProcess(tmp_path / "data", database_url)
    store.start()
    yield store
    store.kill()


def start_publisher(store: StoreProcess, scratch: Path, first_step: int) -> subprocess.Popen[str]:
    scratch.mkdir(exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-c", PUBLISHER, store.url, str(scratch), str(first_step)],
        env=store.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for_upload_in_progress(store: StoreProcess, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(
            p.name.startswith("blob-") and staged_bytes(p) > 0
            for p in (store.blob_dir / "tmp").iterdir()
        ):
            return
        time.sleep(0.01)
    raise AssertionError("no upload started")


def staged_bytes(path: Path) -> int:
    """A staged blob's size; 0 once it is gone (committed by rename between the listing
    and this look)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def visible_versions(store: StoreProcess) -> list[dict[str, Any]]:
    """Every visible version is whole and its files verify."""
    versions: list[dict[str, Any]] = httpx2.get(
        f"{store.url}/v1/jobs/job/versions", headers=service_headers(LoomSettings())
    ).json()["versions"]
    for version in versions:
        assert {f["path"] for f in version["files"]} == {"model.safetensors", "config.json"}
        for entry in version["files"]:
            assert sha256_of(Path(version["local_path"], entry["path"])) == entry["sha256"]
    return versions


def leftovers(store: StoreProcess) -> dict[str, Any]:
    """After a collection with no grace period: what is stored beyond the visible versions."""
    versions = visible_versions(store)
    report = httpx2.post(
        f"{store.url}/v1/gc",
        params={"grace_s": 0},
        timeout=60,
        headers=service_headers(LoomSettings()),
    )
    assert report.status_code == 200, report.text
    referenced = {f["sha256"] for v in versions for f in v["files"]}
    stored = {p.name for shard in (store.blob_dir / "sha256").iterdir() for p in shard.iterdir()}
    numbers = {int(p.name) for p in (store.blob_dir / "versions" / "job").glob("*")}
    found = {
        "unreferenced blobs": stored - referenced,
        "missing blobs": referenced - stored,
        "temp files": [p.name for p in (store.blob_dir / "tmp").iterdir()],
        "staging": [
            p.name for p in (store.blob_dir / "staging").iterdir() if p.name != ".loom-store-id"
        ],
        "stray version dirs": numbers - {v["number"] for v in versions},
    }
    return {name: value for name, value in found.items() if value}


def check_store(store: StoreProcess, settle_s: float = 20) -> int:
    """Visible versions are always whole; collection reclaims everything else. A killed
    client's last request may still be finishing in the store (a staged publish goes on to
    its commit), so the store gets `settle_s` to converge. Returns the number of versions."""
    deadline = time.monotonic() + settle_s
    while (found := leftovers(store)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not found, found
    return len(visible_versions(store))


def test_killing_the_publisher_mid_upload_leaves_nothing_visible(
    store: StoreProcess, tmp_path: Path
) -> None:
    for attempt in range(3):
        publisher = start_publisher(store, tmp_path / "scratch", 1000 * attempt)
        wait_for_upload_in_progress(store)
        time.sleep(random.uniform(0, 0.3))
        publisher.kill()
        publisher.wait()
        check_store(store)


def test_killing_the_store_at_random_moments_loses_nothing_committed(
    store: StoreProcess, tmp_path: Path
) -> None:
    rng = random.Random(7)
    seen = 0
    for attempt in range(4):
        publisher = start_publisher(store, tmp_path / "scratch", 1000 * attempt)
        wait_for_upload_in_progress(store)
        time.sleep(rng.uniform(0, 1.5))
        store.kill()
        publisher.kill()
        output = publisher.communicate()[0]
        store.start()
        versions = check_store(store)
        published = output.count("\npublished ") + output.startswith("published ")
        # Acknowledged publishes all survived (one may have committed unacknowledged).
        assert seen + published <= versions <= seen + published + 1, output
        seen = versions
