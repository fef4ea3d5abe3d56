"""Third-party client SDKs (Tinker, Weaver) installed from PyPI into virtualenvs of their own,
as a user would have them, and scripts run there against a running Loom."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import CACHE


def sdk_python(name: str, requirements: list[str]) -> Path:
    """The python of a virtualenv holding `requirements`, made once and cached."""
    venv = CACHE / f"{name}-venv"
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    wanted = " ".join(requirements)
    if not stamp.exists() or stamp.read_text() != wanted:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *requirements], check=True)
        stamp.write_text(wanted)
    return python


def run_script(python: Path, script: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    """The JSON lines the script printed; the script must succeed."""
    done = subprocess.run(
        [str(python), str(script)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
