"""Reward functions registered by jobs: Python source kept on disk (one file each, written
atomically), so a registration survives restarts. They only ever run in the sandbox."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from services.common.errors import NotFound
from services.reward.schemas import FUNCTION_NAME, JOB_ID, RewardFunction

SHARED = "_shared"  # functions registered without a job
NAME = re.compile(FUNCTION_NAME)
JOB = re.compile(JOB_ID)


class FunctionStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def put(self, name: str, job_id: str | None, code: str) -> RewardFunction:
        path = self._path(name, job_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(code)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(temp, path)
        return RewardFunction(name=name, job_id=job_id, code=code)

    def get(self, name: str, job_id: str | None) -> RewardFunction:
        path = self._path(name, job_id)
        try:
            code = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            owner = f"job {job_id}" if job_id else "no job (shared)"
            raise NotFound(f"no reward function {name!r} registered for {owner}") from None
        return RewardFunction(name=name, job_id=job_id, code=code)

    def list(self, job_id: str | None) -> list[RewardFunction]:
        directory = self._path("x", job_id).parent
        return [self.get(path.stem, job_id) for path in sorted(directory.glob("*.py"))]

    def delete(self, name: str, job_id: str | None) -> None:
        self.get(name, job_id)
        self._path(name, job_id).unlink(missing_ok=True)

    def _path(self, name: str, job_id: str | None) -> Path:
        # Both are validated by the schemas; checked again here since they name files.
        if not NAME.match(name) or (job_id is not None and not JOB.match(job_id)):
            raise NotFound(f"no reward function {name!r} for job {job_id!r}")
        return self.root / (job_id or SHARED) / f"{name}.py"
