"""The checked-in Tinker wire classes are protoc's output for the checked-in .proto: a change
of one without the other fails here (regenerate with the command in tinker_wire.proto)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PROTO = Path("gateway/compat/tinker/tinker_wire.proto")


def test_the_generated_wire_module_matches_its_proto(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I.", f"--python_out={tmp_path}",
         f"--pyi_out={tmp_path}", str(PROTO)],
        cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    for suffix in ("_pb2.py", "_pb2.pyi"):
        generated = tmp_path / PROTO.parent / f"{PROTO.stem}{suffix}"
        checked_in = ROOT / PROTO.parent / f"{PROTO.stem}{suffix}"
        assert generated.read_text() == checked_in.read_text(), (
            f"{checked_in.name} is not protoc's output for {PROTO}: regenerate it"
        )
