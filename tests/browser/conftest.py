"""Browser tests: Playwright drives Debian's chromium (headless) against a real gateway, a real
modelstate and a trainer stand-in, each a uvicorn server in a thread. Rollout is left
unreachable on purpose: the admin must say so on the page.

Playwright's own browser download is not used (`executable_path`); `ensure-chromium.sh`
installs the Debian package. A missing chromium skips these tests, or fails them in CI.
Screenshots go to tests/browser/artifacts/ (git-ignored).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest

from gateway.app import create_app
from gateway.settings import GatewaySettings
from modelstate.app import create_app as create_modelstate_app
from modelstate.settings import ModelStateSettings
from services.common.ports import free_port
from tests.conftest import require
from tests.support.servers import serve_in_thread
from tests.support.trainer import trainer_stand_in

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


@dataclass
class AdminStack:
    url: str
    admin_key: str
    modelstate_url: str

    def api(self, key: str | None = None) -> httpx2.Client:
        return httpx2.Client(
            base_url=self.url,
            timeout=30,
            headers={"Authorization": f"Bearer {key or self.admin_key}"},
        )


# Module scope, not session: while sync Playwright runs, its event loop counts as running in
# this thread, so async tests collected after this module could not start theirs.
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    require(CHROMIUM.exists(), f"Debian's chromium at {CHROMIUM} (see ensure-chromium.sh)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        require(False, "the playwright package (the dev extra)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """Where screenshots go; emptied once per run so what is there belongs to this run."""
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    print(f"\nbrowser test screenshots: {ARTIFACTS}")
    return ARTIFACTS


@pytest.fixture
def admin_stack(tmp_path: Path) -> Iterator[AdminStack]:
    modelstate = create_modelstate_app(
        ModelStateSettings(
            data_dir=tmp_path / "modelstate",
            database_url=f"sqlite:///{tmp_path / 'ms.db'}",
            modelstate_gc_interval_s=0,
        )
    )
    with (
        serve_in_thread(modelstate) as modelstate_url,
        serve_in_thread(trainer_stand_in()) as trainer_url,
    ):
        unreachable = f"http://127.0.0.1:{free_port()}"
        settings = GatewaySettings(
            data_dir=tmp_path / "gateway",
            database_url=f"sqlite:///{tmp_path / 'gw.db'}",
            modelstate_url=modelstate_url,
            trainer_url=trainer_url,
            rollout_url=unreachable,
            reward_url=unreachable,
            sandbox_url=unreachable,
        )
        with serve_in_thread(create_app(settings)) as url:
            yield AdminStack(
                url=url,
                admin_key=settings.admin_key_file.read_text().strip(),
                modelstate_url=modelstate_url,
            )


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context; script errors and console errors (a CSP violation, a failed
    chart) fail the test that caused them."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    opened.set_default_timeout(15_000)
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(f"page error: {error}"))
    opened.on(
        "console",
        lambda message: (
            errors.append(f"console: {message.text}")
            if message.type == "error" and not _expected(message.text)
            else None
        ),
    )
    try:
        yield opened
    finally:
        context.close()
    assert not errors, errors


def _expected(console_text: str) -> bool:
    # Chromium logs every non-2xx page load; the tests ask for some (403, 404) on purpose.
    return "Failed to load resource" in console_text
