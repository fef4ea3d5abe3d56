"""save_weights: write the model's files to scratch space, publish them as a new version."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from modelstate.client import ModelStateClient
from modelstate.schemas import PublishRequest, Version, VersionKind
from services.trainer.model import TrainerModel
from services.trainer.schemas import SaveWeightsRequest, SaveWeightsResult


class ThreadPublisher:
    """Publishes from the operation worker thread through the app's async client.

    The client's pooled connections belong to the app's event loop, so the upload runs there
    (`run_coroutine_threadsafe`) while the worker thread waits for it. That thread is the
    model's only executor, so waiting costs nothing, and the event loop keeps serving requests
    meanwhile; a second, synchronous HTTP client would duplicate the client's error mapping."""

    def __init__(self, client: ModelStateClient, loop: asyncio.AbstractEventLoop) -> None:
        self._client = client
        self._loop = loop

    def publish(self, request: PublishRequest, directory: Path) -> Version:
        future = asyncio.run_coroutine_threadsafe(
            self._client.publish(request, directory), self._loop
        )
        return future.result()


def save_weights(
    model: TrainerModel, request: SaveWeightsRequest, publisher: ThreadPublisher, work_dir: Path
) -> SaveWeightsResult:
    work_dir.mkdir(parents=True, exist_ok=True)
    kind = VersionKind(model.spec.mode.value)
    with tempfile.TemporaryDirectory(dir=work_dir, prefix=f"{model.spec.job_id}-") as scratch:
        model.save(Path(scratch))
        version = publisher.publish(
            PublishRequest(
                job_id=model.spec.job_id, kind=kind, base_model=model.spec.base_model,
                step=model.step, parent=model.last_version, metrics=request.metrics,
                aliases=request.aliases,
            ),
            Path(scratch),
        )
    model.last_version = version.number
    return SaveWeightsResult(job_id=version.job_id, number=version.number,
                             kind=version.kind.value, step=model.step)
