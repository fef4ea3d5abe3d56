"""The layering rule (.importlinter) holds, and `lint-imports` catches an import that breaks it:
each case plants one line in a copy of the source tree and checks the named contract fails."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agents", "cli", "gateway", "modelstate", "services")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` on the source tree at `tree` (it imports the packages from its cwd)."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("tree")
    shutil.copy(ROOT / ".importlinter", copy)
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package,
            copy / package,
            ignore=shutil.ignore_patterns("__pycache__", "static", "templates"),
        )
    return copy


def test_the_source_tree_keeps_every_contract(tree: Path) -> None:
    result = lint_imports(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "planted", "contract"),
    [
        # the gateway reaching up into the CLI
        ("gateway/formatting.py", "import cli.common", "One way down"),
        # the service kit reaching up into the gateway
        ("services/common/errors.py", "import gateway.app", "One way down"),
        # a service reaching into a sibling it may not know
        ("services/trainer/losses.py", "import services.rollout.sampling", "One way down"),
        # the SDK loading the server stack
        ("agents/sdk/_http.py", "import fastapi", "The SDK and the wire protocol"),
    ],
)
def test_a_planted_import_breaks_its_contract(
    tree: Path, module: str, planted: str, contract: str
) -> None:
    path = tree / module
    original = path.read_text()
    path.write_text(f"{original}\n{planted}  # planted\n")
    try:
        result = lint_imports(tree)
    finally:
        path.write_text(original)
    assert result.returncode == 1, result.stdout + result.stderr
    broken = result.stdout.split("Broken contracts", 1)[1]
    assert contract in broken
    assert module.removesuffix(".py").replace("/", ".") in broken
