"""Base model names → what engines load. Nothing is fetched from a hub at run time here, so
names map to local directories: `loom/tiny` is generated on first use under the data dir; an
existing directory is used as is; anything else is a hub name: its cached snapshot when there
is one, else passed through to be downloaded, unless the hub is off (HF_HUB_OFFLINE=1), where
it is refused at once (the hub client would otherwise retry for most of a minute)."""

from __future__ import annotations

import fcntl
from pathlib import Path

from services.common.errors import InvalidInput
from services.common.tiny_model import build_tiny_model, is_tiny_model

TINY_MODEL = "loom/tiny"


def resolve_base_model(name: str, data_dir: Path) -> str:
    if name == TINY_MODEL:
        return str(ensure_tiny_model(data_dir / "models" / "tiny"))
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise InvalidInput(f"{name!r} is a directory without config.json: not a model")
        return str(path.resolve())
    if name.startswith(("/", ".", "~")):
        raise InvalidInput(f"Base model directory {name!r} does not exist")
    return _hub_model(name)


def _hub_model(name: str) -> str:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return snapshot_download(name, local_files_only=True)
    except HFValidationError as exc:
        raise InvalidInput(
            f"{name!r} is neither a model directory nor a hub model name: {exc}"
        ) from exc
    except LocalEntryNotFoundError:
        if constants.HF_HUB_OFFLINE:
            raise InvalidInput(
                f"Hub model {name!r} is not in the local cache ({constants.HF_HUB_CACHE}) and "
                "the hub is off (HF_HUB_OFFLINE=1): download it first, or give a model "
                "directory."
            ) from None
    return name


def ensure_tiny_model(directory: Path) -> Path:
    """Build the tiny model once, even when several services ask at the same moment."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / ".tiny.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_tiny_model(directory):
            build_tiny_model(directory)
    return directory
