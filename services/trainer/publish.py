"""save_weights: write the model's files where the store can take them, publish a version.

On the store's own filesystem the files are written straight into its staging area and
published by a rename (the bytes are written once); otherwise into scratch space and uploaded
(only contents the store does not hold yet). The weight files are written over the job's page
reserve, which is filled again for the next save once this one is published."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from modelstate.client import ModelStateClient
from modelstate.schemas import Version, VersionKind, VersionMeta
from services.trainer.distributed.remote import RemoteModel
from services.trainer.model import TrainerModel
from services.trainer.page_reserve import PageReserve
from services.trainer.schemas import SaveWeightsRequest, SaveWeightsResult

T = TypeVar("T")


class ThreadPublisher:
    """Publishes from the operation worker thread through the app's async client.

    The client's pooled connections belong to the app's event loop, so its calls run there
    (`run_coroutine_threadsafe`) while the worker thread waits. That thread is the model's
    only executor, so waiting costs nothing, and the event loop keeps serving requests
    meanwhile; a second, synchronous HTTP client would duplicate the client's error mapping."""

    def __init__(self, client: ModelStateClient, loop: asyncio.AbstractEventLoop) -> None:
        self._client = client
        self._loop = loop

    def _run(self, call: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(call, self._loop).result()

    def staging_dir(self) -> Path | None:
        return self._run(self._client.staging_dir())

    def publish(self, meta: VersionMeta, directory: Path) -> Version:
        return self._run(self._client.publish(meta, directory))


def save_weights(
    model: TrainerModel | RemoteModel,
    request: SaveWeightsRequest,
    publisher: ThreadPublisher,
    work_dir: Path,
    shard_bytes: int,
    reserve: PageReserve,
) -> SaveWeightsResult:
    directory = publisher.staging_dir()
    if directory is None:
        work_dir.mkdir(parents=True, exist_ok=True)
        directory = Path(tempfile.mkdtemp(dir=work_dir, prefix=f"{model.spec.job_id}-"))
    try:
        model.save(directory, shard_bytes, reserve)
        weights = {path.name: path.stat().st_size for path in directory.glob("*.safetensors")}
        version = publisher.publish(
            VersionMeta(
                job_id=model.spec.job_id,
                kind=VersionKind(model.spec.mode.value),
                base_model=model.spec.base_model,
                step=model.step,
                parent=model.last_version,
                metrics=request.metrics,
                aliases=request.aliases,
            ),
            directory,
        )
    finally:
        reserve.release()
        shutil.rmtree(directory, ignore_errors=True)  # a published staging dir is gone already
    reserve.refill(directory.parent, weights)
    model.last_version = version.number
    return SaveWeightsResult(
        job_id=version.job_id, number=version.number, kind=version.kind.value, step=model.step
    )
