"""Wheels for a GPU benchmark on the device machine: what its imports need that the machine's
image lacks, at the versions installed here, for the image's Python (CPython 3.12, x86-64
Linux). The benchmark's run carries the directory and installs it first (see
bench/trainer_gpu_scale.py).

Found, not listed by hand (what the trainer imports changes): a fresh interpreter imports the
benchmark; the distributions of the modules that loads which the image does not have
(`IMAGE_NAMES`), with everything they require on that Python (pure-Python ones even where the image
has them: its versions may be older than they ask), are downloaded.

    python -m bench.device_wheels DIRECTORY [--module bench.trainer_gpu_scale]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import sysconfig
from importlib.metadata import Distribution, PackageNotFoundError, distribution, distributions
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent
# The Python distributions of the device machine's image ('cuda'), as the workplace's notes on
# the device listed them (read 2026-11-17).
IMAGE_NAMES = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl
meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime
onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich
sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn
sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric
torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions
typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
"""
# The image's Python, for requirements' markers and the wheels' tags.
TARGET = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "extra": "",
}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# The files of the modules (outside the standard library) that importing the module loads.
PROBE = (
    "import importlib, json, sys\n"
    "before = set(sys.modules)\n"
    "importlib.import_module({module!r})\n"
    "new = [sys.modules[m] for m in set(sys.modules) - before\n"
    "       if m.split('.')[0] not in sys.stdlib_module_names]\n"
    "print(json.dumps(sorted({{m.__file__ for m in new if getattr(m, '__file__', None)}})))\n"
)


def needed(module: str) -> list[str]:
    """name==version (as installed here) of every distribution to carry for `module`."""
    probe = PROBE.format(module=module)
    found = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
    )
    files = {Path(f).resolve() for f in json.loads(found.stdout.splitlines()[-1])}
    owners = {
        Path(str(dist.locate_file(file))).resolve(): dist.metadata["Name"]
        for dist in distributions()
        for file in dist.files or []
        if file.suffix in (".py", ".so")
    }
    files = {f for f in files if not _ours(f) and not _interpreters(f)}
    unowned = sorted(str(f) for f in files if f not in owners)
    if unowned:
        raise SystemExit(f"No installed distribution owns {unowned[:3]}: install this repo's deps")
    image = {_normal(name) for name in IMAGE_NAMES.split()}
    missing = {owners[f] for f in files if _normal(owners[f]) not in image}
    carried = _with_requirements(missing, image)
    return sorted(f"{d.metadata['Name']}=={d.version}" for d in carried)


def _with_requirements(names: set[str], image: set[str]) -> list[Distribution]:
    """`names` and what they require on the image's Python, as installed here; of what the
    image has, only pure-Python distributions (a compiled one stays the image's build)."""
    carried: dict[str, Distribution] = {}
    todo = sorted(names)
    while todo:
        name = _normal(todo.pop())
        if name in carried:
            continue
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            raise SystemExit(f"{name} is required but not installed here") from None
        if name in image and not _pure(dist):
            continue
        carried[name] = dist
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate(TARGET):
                todo.append(requirement.name)
    return list(carried.values())


def _pure(dist: Distribution) -> bool:
    return not any(file.suffix == ".so" for file in dist.files or [])


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _ours(path: Path) -> bool:
    """A module of this repository (not of a virtual environment made inside it)."""
    return path.is_relative_to(REPO) and not path.is_relative_to(Path(sys.prefix).resolve())


def _interpreters(path: Path) -> bool:
    """A module of the interpreter's own library (some lie outside `stdlib_module_names`)."""
    return path.is_relative_to(Path(sysconfig.get_paths()["stdlib"]).resolve())


def download(requirements: list[str], directory: Path) -> None:
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"),
            *("--python-version", TARGET["python_version"], "--implementation", "cp"),
            *(*platforms, "-d", str(directory), *requirements),
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
