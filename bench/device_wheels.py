"""Wheels for a GPU benchmark on the device machine: what its imports need beyond what that
machine's image has (torch, peft, transformers and what they import), at the versions
installed here, built for the image's Python (CPython 3.12, x86-64 Linux). The benchmark's
run carries the directory and installs it first (see bench/trainer_gpu_scale.py).

Found, not listed by hand (what the trainer imports changes): a fresh interpreter imports the
image's packages, then the benchmark; the distributions of the packages that loads anew
(this repository's aside) are downloaded, and typing-extensions too (pydantic needs a newer
one than the image may have).

    python -m bench.device_wheels DIRECTORY [--module bench.trainer_gpu_scale]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from importlib.metadata import distributions, version
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ON_DEVICE = ("torch", "peft", "transformers", "safetensors")
ALWAYS = ("typing-extensions",)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# The files of the modules that importing the module loads from packages the device's
# packages did not load (their own submodules and their requirements are on the device).
PROBE = (
    "import importlib, json, sys\n"
    "for name in {on_device!r}: importlib.import_module(name)\n"
    "before = set(sys.modules)\n"
    "tops = {{m.split('.')[0] for m in before}} | sys.stdlib_module_names\n"
    "importlib.import_module({module!r})\n"
    "new = [sys.modules[m] for m in set(sys.modules) - before if m.split('.')[0] not in tops]\n"
    "print(json.dumps(sorted({{m.__file__ for m in new if getattr(m, '__file__', None)}})))\n"
)


def needed(module: str) -> list[str]:
    """Distributions (name==version, as installed here) that importing `module` loads
    besides the device's packages, what they load, this repository and the standard library."""
    probe = PROBE.format(on_device=ON_DEVICE, module=module)
    found = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
    )
    files = {Path(f).resolve() for f in json.loads(found.stdout.splitlines()[-1])}
    files = {f for f in files if not _ours(f)}
    owners = {
        Path(str(dist.locate_file(file))).resolve(): dist.metadata["Name"]
        for dist in distributions()
        for file in dist.files or []
        if file.suffix in (".py", ".so")
    }
    unowned = sorted(str(f) for f in files if f not in owners)
    if unowned:
        raise SystemExit(f"No installed distribution owns {unowned}: install this repo's deps")
    names = {owners[f] for f in files} | set(ALWAYS)
    return sorted(f"{name}=={version(name)}" for name in names)


def _ours(path: Path) -> bool:
    """A module of this repository (not of a virtual environment made inside it)."""
    return path.is_relative_to(REPO) and not path.is_relative_to(Path(sys.prefix).resolve())


def download(requirements: list[str], directory: Path) -> None:
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"),
            *("--python-version", "3.12", "--implementation", "cp", *platforms),
            *("-d", str(directory), *requirements),
        ],
        check=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--module", default="bench.trainer_gpu_scale")
    args = parser.parse_args()
    requirements = needed(args.module)
    print("downloading:", " ".join(requirements), flush=True)
    download(requirements, args.directory)


if __name__ == "__main__":
    main()
