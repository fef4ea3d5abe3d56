"""Weaver's storage paths: `weaver://<model_id>/checkpoints/<name>` for training state (a
trainer checkpoint of the model's job) and `weaver://<model_id>/sampler_weights/<name>` for
weights a sampler serves (a modelstate version). A Weaver model id is its Loom job id."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from services.common.errors import InvalidInput
from services.trainer.schemas import StateCheckpoint

SCHEME = "weaver://"
CHECKPOINTS, SAMPLER_WEIGHTS = "checkpoints", "sampler_weights"
VERSION_NAME = re.compile(r"^v(\d+)$")  # an unnamed sampler export: `v<version>`


@dataclass(frozen=True)
class WeaverPath:
    model_id: str
    kind: str
    name: str

    def __str__(self) -> str:
        return f"{SCHEME}{self.model_id}/{self.kind}/{self.name}"

    @property
    def version(self) -> int | None:
        """The version an unnamed sampler export names, found again after a restart."""
        match = VERSION_NAME.match(self.name)
        return int(match.group(1)) if self.kind == SAMPLER_WEIGHTS and match else None


def parse(path: str, kind: str) -> WeaverPath:
    parts = path.removeprefix(SCHEME).split("/") if path.startswith(SCHEME) else []
    if len(parts) != 3 or parts[1] != kind or not parts[0] or not parts[2]:
        what = "save_state" if kind == CHECKPOINTS else "save_weights_for_sampler"
        raise InvalidInput(
            f"{path!r} is not a path {what} returned: {SCHEME}<model_id>/{kind}/<name>."
        )
    return WeaverPath(*parts)


def checkpoint(model_id: str, saved: StateCheckpoint, kind: str | None = None) -> dict[str, Any]:
    """One checkpoint as the SDK's `Checkpoint` reads it."""
    path = WeaverPath(model_id, CHECKPOINTS, saved.name)
    return {
        "id": str(path),
        "path": str(path),
        "name": saved.name,
        "checkpoint_type": kind or ("weight_and_optimizer" if saved.has_optimizer else "weight"),
        "status": "completed",
        "size_bytes": saved.bytes,
        "step": saved.step,
        "ttl_seconds": None
        if saved.expires_at is None
        else round((saved.expires_at - saved.created_at).total_seconds()),
        "created_at": saved.created_at.isoformat(),
        "expires_at": None if saved.expires_at is None else saved.expires_at.isoformat(),
    }
