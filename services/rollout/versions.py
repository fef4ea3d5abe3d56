"""Weight hand-off on the rollout side: which version a request means, and making it the one
that serves. Full versions swap the engine's weights (one at a time, behind `WeightsGate`);
LoRA versions are adapters on the base weights (several resident, `LoraSlots`).

On the store's host an idle engine loads a full-weight publish as soon as modelstate announces
it as pending, while the store is still verifying the files; the version's own event then only
names the loaded weights, provided its files are the very files that were loaded (same
inodes). Nothing is served on them before that event: a publish that fails leaves weights no
request asks for, and the next request swaps in what it needs."""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal, Protocol

from vllm.lora.request import LoRARequest

from modelstate.schemas import (
    ALIAS_PATTERN,
    MAX_VERSION_NUMBER,
    PendingVersion,
    Version,
    VersionKey,
    VersionKind,
)
from services.common.errors import Conflict, InvalidInput, LoomError, NotFound
from services.rollout.engine import BASE_WEIGHTS_LABEL
from services.rollout.lora_slots import LoraEngine, LoraSlots
from services.rollout.schemas import LoadedVersion, ResidentVersions, VersionRef
from services.rollout.weights_check import (
    WEIGHTS_SUFFIX,
    TensorSpecs,
    check_loadable,
    tensor_specs,
)
from services.rollout.weights_gate import WeightsGate

log = logging.getLogger(__name__)

LATEST = "latest"
# Versions published this long before the subscription started are history, not news.
PRELOAD_CLOCK_SKEW = timedelta(seconds=30)


class VersionStore(Protocol):
    """What rollout needs of `modelstate.client.ModelStateClient`."""

    async def get_version(self, job_id: str, ref: int | str) -> Version: ...

    def subscribe_events(
        self, job_id: str | None = None, after: int = 0
    ) -> AsyncIterator[Version | PendingVersion]: ...


class WeightsEngine(LoraEngine, Protocol):
    async def reload_weights(self, weights_path: str, label: str) -> None: ...

    async def label_weights(self, label: str) -> None: ...


Materialize = Callable[[Version], Awaitable[Path]]


@dataclass(frozen=True)
class Target:
    """A resolved version: what must be loaded for a request to be served by it."""

    job_id: str | None
    number: int
    kind: Literal["base", "full", "lora"]
    path: str | None = None

    @property
    def name(self) -> str:
        return f"{self.job_id}@{self.number}"

    @property
    def weights(self) -> str:
        """The label of the full weights it runs on: LoRA adapters apply to the base."""
        return self.name if self.kind == "full" else BASE_WEIGHTS_LABEL

    def loaded(self) -> LoadedVersion:
        return LoadedVersion(job_id=self.job_id, number=self.number, kind=self.kind)


@dataclass(frozen=True)
class Served:
    """A version held for one request: `lora_request` is None unless it is an adapter."""

    target: Target
    lora_request: LoRARequest | None


@dataclass(frozen=True)
class Preloaded:
    """Full weights loaded from a pending publish: (device, inode) of each weight file by
    relative path. Only weight files count: the store keeps an existing blob for a file whose
    content it already holds (every version's config and tokenizer files), and a reload reads
    weights only. A weight file deduplicated that way (a shard training left unchanged) means
    one reload more, never a wrong one."""

    files: dict[str, tuple[int, int]]

    def same_files(self, directory: str) -> bool:
        stats = _stat_all(Path(directory), self.files)
        return (
            stats is not None
            and {path: (stat.st_dev, stat.st_ino) for path, stat in stats.items()} == self.files
        )


def base_target(job_id: str | None = None) -> Target:
    return Target(job_id=job_id, number=0, kind="base")


class Versions:
    def __init__(
        self,
        engine: WeightsEngine,
        store: VersionStore,
        materialize: Materialize,
        *,
        base_model: str,
        base_path: str,
        max_loras: int,
    ) -> None:
        self.engine = engine
        self.store = store
        self.materialize = materialize
        self.base_model = base_model
        self.base_path = base_path
        self.gate = WeightsGate(BASE_WEIGHTS_LABEL, self.succeeds)
        self.loras = LoraSlots(engine, max_loras)
        self._full: Target | None = base_target()
        self._preloaded: Preloaded | None = None
        self._known: dict[tuple[str, int], Target] = {}  # published versions never change
        self._full_by_label: dict[str, Target] = {}
        self._newest: dict[str, int] = {}  # per job, the newest version announced
        self._announced = asyncio.Condition()
        self._served: TensorSpecs | None = None  # the base model's tensors, once read

    # --- resolution ---------------------------------------------------------------------

    async def resolve(self, job_id: str | None, ref: VersionRef) -> Target:
        """Numbers are immutable (cached); aliases are asked of modelstate every time, so a
        request right after a publish sees it. `latest` of a job with no versions is 0."""
        ref = _normalize(ref)
        if job_id is None:
            if ref in (0, LATEST):
                return base_target()
            raise InvalidInput(
                f"Version {ref!r} needs a job_id: without one only the base "
                "model (version 0 or 'latest') can be served."
            )
        if ref == 0:
            return base_target(job_id)
        if isinstance(ref, int) and (job_id, ref) in self._known:
            return self._known[(job_id, ref)]
        try:
            version = await self.store.get_version(job_id, ref)
        except NotFound:
            if ref == LATEST:
                return base_target(job_id)
            raise
        return await self.target_of(version)

    async def target_of(self, version: Version) -> Target:
        key = (version.job_id, version.number)
        if key not in self._known:
            kind: Literal["full", "lora"] = "full" if version.kind == VersionKind.full else "lora"
            if kind == "lora" and not self.loras.capacity:  # refused before any download
                raise Conflict(
                    f"Version {version.number} of job {version.job_id!r} is a LoRA adapter, and "
                    "this rollout engine runs without LoRA layers (LOOM_ROLLOUT_MAX_LORAS=0): "
                    "set it to 1 or more and restart rollout.",
                    {"job_id": version.job_id, "number": version.number},
                )
            path = await self.materialize(version)
            target = self._known[key] = Target(version.job_id, version.number, kind, str(path))
            if kind == "full":
                self._full_by_label[target.weights] = target
        return self._known[key]

    def full_target(self, label: str) -> Target | None:
        """The published full version whose weights carry `label`, if any."""
        return self._full_by_label.get(label)

    def succeeds(self, newer: str, older: str) -> bool:
        """Whether full weights `newer` are a later version of the job of `older`."""
        new, old = self.full_target(newer), self.full_target(older)
        return (
            new is not None
            and old is not None
            and new.job_id == old.job_id
            and new.number > old.number
        )

    # --- serving ------------------------------------------------------------------------

    @asynccontextmanager
    async def use(
        self, job_id: str | None, ref: VersionRef, *, movable: bool = False
    ) -> AsyncIterator[Served]:
        """Resolve and hold a version loaded while the block runs. `movable` (partial
        rollouts): full weights may move on to later versions of the job meanwhile."""
        target = await self.resolve(job_id, ref)
        async with self.hold(target, movable=movable) as served:
            yield served

    @asynccontextmanager
    async def hold(self, target: Target, *, movable: bool = False) -> AsyncIterator[Served]:
        async with self.gate.hold(
            target.weights,
            lambda: self._swap_full_weights(target),
            movable=movable and target.kind == "full",
        ):
            if target.kind != "lora":
                yield Served(target, None)
                return
            assert target.path is not None  # LoRA targets come from a materialized version
            async with self.loras.use(target.name, target.path) as lora_request:
                yield Served(target, lora_request)

    async def load(self, job_id: str, ref: VersionRef) -> LoadedVersion:
        async with self.use(job_id, ref) as served:
            return served.target.loaded()

    async def _swap_full_weights(self, target: Target) -> None:
        path = target.path if target.kind == "full" else self.base_path
        assert path is not None
        preloaded, self._preloaded = self._preloaded, None
        if target.kind == "full" and preloaded is not None and preloaded.same_files(path):
            await self.engine.label_weights(target.weights)  # loaded while it was pending
        else:
            await self._reload(path, target.weights)
        self._full = target if target.kind == "full" else base_target()
        log.info("full weights now %s", target.weights)

    async def _reload(self, path: str, label: str) -> None:
        if path != self.base_path and (served := self._served_tensors()) is not None:
            check_loadable(path, served, f"The weights of {label}")  # before any is touched
        self._full = None  # unknown until the reload succeeds
        self._preloaded = None
        async with self.loras.lock:
            try:
                await self.engine.reload_weights(path, label)
            finally:
                self.loras.forget_all()  # vLLM drops adapters whenever base weights change

    async def preload_pending(self, pending: PendingVersion) -> bool:
        """Load a pending full-weight publish's files if they are on this host and the engine
        is idle; whether it did."""
        if pending.kind != VersionKind.full:
            return False
        directory = Path(pending.local_path)
        stats = _stat_all(directory, pending.files)
        if stats is None or any(
            stats[path].st_size != size for path, size in pending.files.items()
        ):
            return False  # not this host's store, or collected already
        files = {
            path: (stat.st_dev, stat.st_ino)
            for path, stat in stats.items()
            if path.endswith(WEIGHTS_SUFFIX)
        }
        if not files:
            return False
        label = f"pending:{pending.staged}"

        async def load() -> None:
            await self._reload(str(directory), label)
            self._preloaded = Preloaded(files)

        return await self.gate.swap_if_idle(label, load)

    def _served_tensors(self) -> TensorSpecs | None:
        """The base model's tensors, read once; None where its files cannot be read here (a
        hub name): versions are then loaded unchecked."""
        if self._served is None:
            try:
                self._served = tensor_specs(self.base_path)
            except (InvalidInput, OSError):
                self._served = {}
        return self._served or None

    def resident(self) -> ResidentVersions:
        loras = [name.rsplit("@", 1) for name in self.loras.resident]
        return ResidentVersions(
            base_model=self.base_model,
            full=self._full.loaded() if self._full else None,
            loras=[LoadedVersion(job_id=job, number=int(n), kind="lora") for job, n in loras],
        )

    def pinned_keys(self) -> list[VersionKey]:
        """Published versions this engine holds (modelstate does not store base models)."""
        resident = self.resident()
        held = [*resident.loras, *([resident.full] if resident.full else [])]
        return [
            VersionKey(job_id=v.job_id, number=v.number)
            for v in held
            if v.job_id is not None and v.number > 0
        ]

    # --- hand-off on publish --------------------------------------------------------------

    def newest(self, job_id: str) -> int:
        """The newest version of `job_id` announced so far (0: none)."""
        return self._newest.get(job_id, 0)

    async def newer_than(self, job_id: str, number: int) -> int:
        """Wait until a version of `job_id` newer than `number` is published; its number."""
        async with self._announced:
            await self._announced.wait_for(lambda: self._newest.get(job_id, 0) > number)
            return self._newest[job_id]

    async def _announce(self, version: Version) -> None:
        async with self._announced:
            if version.number > self._newest.get(version.job_id, 0):
                self._newest[version.job_id] = version.number
                self._announced.notify_all()

    async def preload(self, version: Version) -> None:
        """Make a just-published version resident, so its first sample is fast."""
        if version.kind == VersionKind.lora and not self.loras.capacity:
            return  # an engine without LoRA layers: sampling it is refused
        target = await self.target_of(version)
        if target.kind == "lora":
            assert target.path is not None
            await self.loras.ensure(target.name, target.path)
        else:
            async with self.hold(target):
                pass

    async def follow_publications(self, retry_s: float = 1.0) -> None:
        """Pre-load every version published from now on. Runs until cancelled: it outlives
        modelstate restarts (the client reconnects and resumes) and a modelstate that is down
        when rollout starts."""
        since = datetime.now(UTC) - PRELOAD_CLOCK_SKEW
        after = 0
        while True:
            try:
                async for event in self.store.subscribe_events(after=after):
                    if isinstance(event, PendingVersion):
                        await self._logged(self.preload_pending(event), "pending", event.staged)
                        continue
                    version = event
                    after = max(after, version.id)
                    if _as_utc(version.created_at) < since:
                        continue
                    if version.kind == VersionKind.lora:
                        # Adapters sit side by side: partial rollouts move over once it is
                        # resident, so they never wait for it to load.
                        await self._preload_logged(version)
                        await self._announce(version)
                    else:
                        # Announced first, so partial rollouts starting a turn go straight
                        # to it; this pre-load swaps it in under the ones already running.
                        await self._announce(version)
                        await self._preload_logged(version)
            except LoomError as exc:
                log.warning("modelstate events unavailable (%s); retrying", exc.message)
            await asyncio.sleep(retry_s)

    async def _preload_logged(self, version: Version) -> None:
        await self._logged(self.preload(version), version.job_id, version.number)

    @staticmethod
    async def _logged(work: Awaitable[object], *what: object) -> None:
        name = "@".join(map(str, what))
        try:
            await work
        except LoomError as exc:  # one bad version must not stop the hand-off of later ones
            log.warning("could not pre-load %s: %s", name, exc.message)
        except Exception:
            log.exception("could not pre-load %s", name)


def _stat_all(directory: Path, paths: Iterable[str]) -> dict[str, os.stat_result] | None:
    """The stat of each of `paths` under `directory`; None if one is missing."""
    try:
        return {path: os.stat(directory / path) for path in paths}
    except OSError:
        return None


def _as_utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)  # the store writes UTC


def _normalize(ref: VersionRef) -> int | str:
    if isinstance(ref, str) and ref.isascii() and ref.isdigit():
        ref = int(ref)
    if isinstance(ref, int) and not 0 <= ref <= MAX_VERSION_NUMBER:
        raise InvalidInput(
            f"Version numbers go from 0 (the base model) to {MAX_VERSION_NUMBER}, got {ref}."
        )
    if isinstance(ref, str) and not re.fullmatch(ALIAS_PATTERN, ref):
        raise InvalidInput(
            f"Version {ref!r} is neither a number nor an alias (a letter or '_', "
            "then letters, digits, '.', '_' or '-', at most 64)."
        )
    return ref
