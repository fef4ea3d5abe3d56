"""The service token: where it comes from (created once, 0600, the same for processes that
start together) and the middleware that asks every request for it."""

from __future__ import annotations

import multiprocessing
import os
import stat
from pathlib import Path

import httpx2
import pytest
from fastapi import APIRouter
from starlette.types import Message, Receive, Scope, Send

from services.common import service_token as tokens
from services.common.app_factory import ServiceTokenMiddleware, create_service_app
from services.common.service_token import (
    SERVICE_TOKEN_HEADER,
    ServiceTokenError,
    client_of,
    service_token,
    token_environment,
)
from services.common.settings import LoomSettings
from services.reward.client import RewardClient

TOKEN = "t" * 32


@pytest.fixture(autouse=True)
def no_token_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite sets LOOM_SERVICE_TOKEN for everything else (tests/conftest.py)."""
    monkeypatch.delenv("LOOM_SERVICE_TOKEN", raising=False)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- where the token comes from ------------------------------------------------------------


def test_first_use_creates_a_private_token_in_a_private_data_dir(tmp_path: Path) -> None:
    settings = LoomSettings(data_dir=tmp_path / "loom")
    token = service_token(settings)
    assert len(token) >= 40  # 32 random bytes
    assert mode(tmp_path / "loom") == 0o700
    assert mode(tmp_path / "loom" / "service_token") == 0o600
    assert service_token(settings) == token  # read back, not made again
    assert os.listdir(tmp_path / "loom") == ["service_token"]  # no temp file left


def test_the_setting_wins_over_any_file_and_a_file_setting_over_the_data_dir(
    tmp_path: Path,
) -> None:
    assert service_token(LoomSettings(data_dir=tmp_path, service_token=TOKEN)) == TOKEN
    assert not (tmp_path / "service_token").exists()
    given = tmp_path / "secrets" / "token"
    given.parent.mkdir()
    given.write_text(f"{'f' * 20}\n")
    assert service_token(LoomSettings(data_dir=tmp_path, service_token_file=given)) == "f" * 20
    made = tmp_path / "elsewhere" / "token"  # a file setting that names no file yet: created
    created = service_token(LoomSettings(data_dir=tmp_path, service_token_file=made))
    assert made.read_text().strip() == created and mode(made) == 0o600


@pytest.mark.parametrize("variable", ["service_token", "service_token_file"])
def test_a_short_token_is_refused_naming_its_setting(tmp_path: Path, variable: str) -> None:
    short = tmp_path / "short"
    short.write_text("secret\n")
    value = {"service_token": "secret", "service_token_file": short}[variable]
    with pytest.raises(ServiceTokenError, match=f"LOOM_{variable.upper()}"):
        service_token(LoomSettings(data_dir=tmp_path, **{variable: value}))


def test_an_unwritable_place_is_an_error_naming_the_setting(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ServiceTokenError, match="LOOM_SERVICE_TOKEN_FILE"):
        service_token(LoomSettings(service_token_file=blocker / "token"))


def test_a_process_that_loses_the_race_takes_the_winners_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between this process's check and its link, another one creates the file."""
    settings = LoomSettings(data_dir=tmp_path)
    real_link = os.link

    def link_after_the_winner(source: str, target: Path) -> None:
        Path(target).write_text("w" * 43 + "\n")
        real_link(source, target)

    monkeypatch.setattr(tokens.os, "link", link_after_the_winner)
    assert service_token(settings) == "w" * 43
    assert os.listdir(tmp_path) == ["service_token"]


def _start_and_report(
    data_dir: str, barrier: multiprocessing.synchronize.Barrier, results: multiprocessing.Queue
) -> None:  # type: ignore[type-arg]
    barrier.wait()
    results.put(service_token(LoomSettings(data_dir=Path(data_dir))))


def test_processes_starting_at_once_all_get_the_same_token(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    count = 8
    barrier, results = context.Barrier(count), context.Queue()
    processes = [
        context.Process(target=_start_and_report, args=(str(tmp_path / "d"), barrier, results))
        for _ in range(count)
    ]
    for process in processes:
        process.start()
    seen = {results.get(timeout=30) for _ in processes}
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0
    assert seen == {(tmp_path / "d" / "service_token").read_text().strip()}
    assert os.listdir(tmp_path / "d") == ["service_token"]


def test_children_are_handed_the_file_not_the_token(tmp_path: Path) -> None:
    settings = LoomSettings(data_dir=tmp_path)
    env = token_environment(settings)
    assert env == {"LOOM_SERVICE_TOKEN_FILE": str(tmp_path / "service_token")}
    assert (tmp_path / "service_token").exists()  # made before any child starts
    assert token_environment(LoomSettings(service_token=TOKEN)) == {"LOOM_SERVICE_TOKEN": TOKEN}
    with pytest.raises(ServiceTokenError):  # refused before any child starts with it
        token_environment(LoomSettings(service_token="short"))


def test_data_dir_and_database_files_are_private(tmp_path: Path) -> None:
    settings = LoomSettings(data_dir=tmp_path / "new")
    url = settings.database_url_for("gateway")
    assert mode(tmp_path / "new") == 0o700
    assert mode(tmp_path / "new" / "gateway.db") == 0o600 and url.endswith("gateway.db")


async def test_service_clients_send_the_token(tmp_path: Path) -> None:
    seen: list[str | None] = []

    def record(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.headers.get(SERVICE_TOKEN_HEADER))
        return httpx2.Response(200, json={})

    settings = LoomSettings(data_dir=tmp_path, service_token=TOKEN)
    client = client_of(settings, RewardClient, transport=httpx2.MockTransport(record))
    await client.get_json("/v1/anything")
    await client.aclose()
    assert seen == [TOKEN]


# --- the middleware --------------------------------------------------------------------------


def _guarded() -> tuple[httpx2.AsyncClient, list[str]]:
    router, handled = APIRouter(), []

    @router.post("/v1/act")
    async def act() -> dict[str, bool]:
        handled.append("act")
        return {"done": True}

    app = create_service_app("test", routers=[router], service_token=TOKEN)
    return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://t"), handled


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {SERVICE_TOKEN_HEADER: "wrong"},
        {SERVICE_TOKEN_HEADER: TOKEN[:-1]},
        {SERVICE_TOKEN_HEADER: TOKEN + "x"},
        {"Authorization": f"Bearer {TOKEN}"},
    ],
)
async def test_a_request_without_the_token_is_refused_before_any_handler(
    headers: dict[str, str],
) -> None:
    client, handled = _guarded()
    async with client:
        refused = await client.post("/v1/act", headers=headers, json={})
    assert refused.status_code == 401 and handled == []
    error = refused.json()["error"]
    assert error["code"] == "unauthorized" and "LOOM_SERVICE_TOKEN" in error["message"]
    assert refused.headers["x-request-id"]  # still stamped and counted like any answer


async def test_two_copies_of_the_header_are_refused_even_if_one_is_right() -> None:
    client, handled = _guarded()
    async with client:
        refused = await client.post(
            "/v1/act", headers=[(SERVICE_TOKEN_HEADER, "wrong"), (SERVICE_TOKEN_HEADER, TOKEN)]
        )
    assert refused.status_code == 401 and handled == []


async def test_the_token_lets_a_request_through_and_probes_need_none() -> None:
    client, handled = _guarded()
    async with client:
        done = await client.post("/v1/act", headers={SERVICE_TOKEN_HEADER: TOKEN})
        assert done.status_code == 200 and handled == ["act"]
        for path in ("/healthz", "/readyz", "/metrics"):
            assert (await client.get(path)).status_code == 200, path
        assert (await client.get("/healthz/")).status_code == 401  # exact paths only
        assert (await client.get("/docs")).status_code == 401


async def test_a_websocket_without_the_token_is_closed_before_the_app_sees_it() -> None:
    reached, sent = [], []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(scope["type"])

    async def receive() -> Message:
        return {"type": "websocket.connect"}

    async def send(message: Message) -> None:
        sent.append(message)

    guard = ServiceTokenMiddleware(app, TOKEN)
    await guard({"type": "websocket", "path": "/v1/live", "headers": []}, receive, send)
    assert reached == [] and sent == [{"type": "websocket.close", "code": 1008}]
    header = (SERVICE_TOKEN_HEADER.lower().encode(), TOKEN.encode())
    await guard({"type": "websocket", "path": "/v1/live", "headers": [header]}, receive, send)
    assert reached == ["websocket"]
