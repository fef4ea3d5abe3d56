"""A job key's tricks against the proxy, through real servers: paths spelled to be read one way
by the gateway's scope check and another by the service (dot segments, encoded slashes, doubled
slashes, trailing dots, mixed case), and bodies past the cap. Every service is one recorder
here, so "refused" also means "nothing reached a service", hence nothing changed."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx2
import pytest
from fastapi import FastAPI, Request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.sdk import AsyncLoomClient
from gateway.app import create_app
from gateway.proxy.target import proxy_target
from gateway.settings import UPSTREAMS, GatewaySettings
from services.common.errors import BadRequest
from tests.support.servers import serve_in_thread
from tests.support.trainer import trainer_stand_in

MINE, THEIRS = "{mine}", "{theirs}"


@dataclass
class Recorded:
    """Requests that reached a service: (method, raw target) at arrival; `completed` once the
    whole body was read and answered."""

    arrived: list[tuple[str, str]] = field(default_factory=list)
    completed: list[tuple[str, str, int]] = field(default_factory=list)


def recorder() -> tuple[FastAPI, Recorded]:
    """The trainer stand-in (jobs need its `POST /v1/models`) answering every other route of
    every service with 200, and recording what arrives."""
    app, seen = trainer_stand_in(), Recorded()

    @app.middleware("http")
    async def record(request: Request, call_next):  # type: ignore[no-untyped-def]
        target = request.scope["raw_path"].decode("latin-1")
        query = request.scope["query_string"].decode("latin-1")
        seen.arrived.append((request.method, target + (f"?{query}" if query else "")))
        return await call_next(request)

    async def anything(request: Request) -> dict[str, object]:
        body = await request.body()
        seen.completed.append((request.method, request.scope["raw_path"].decode(), len(body)))
        return {"raw_path": request.scope["raw_path"].decode("latin-1"), "bytes": len(body)}

    app.add_api_route("/{rest:path}", anything, methods=["GET", "POST", "PUT", "DELETE"])
    return app, seen


@dataclass
class Gateway:
    url: str
    admin_key: str
    alice: str  # owns `mine`
    mine: str
    theirs: str  # bob's job
    seen: Recorded

    def raw(self, method: str, target: str, key: str, body: bytes = b"") -> tuple[int, bytes]:
        """One request with its target sent exactly as given (httpx would remove dot segments,
        as curl does without --path-as-is). Like curl, a body waits for `100 Continue`, so a
        refusal before the body is read is seen, not cut off by a reset."""
        parts = urlsplit(self.url)
        head = (
            f"{method} {target} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n"
            + ("Expect: 100-continue\r\n" if body else "")
            + "\r\n"
        )
        with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
            sock.sendall(head.encode("latin-1"))
            response = b""
            if body:
                response = sock.recv(65536)
                if response.startswith(b"HTTP/1.1 100"):
                    response = response.partition(b"\r\n\r\n")[2]
                    sock.sendall(body)
            while chunk := sock.recv(65536):
                response += chunk
        status_line, _, rest = response.partition(b"\r\n")
        return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data_dir: Path = tmp_path_factory.mktemp("gateway") / "data"
    app, seen = recorder()
    with serve_in_thread(app) as service_url:
        settings = GatewaySettings(
            data_dir=data_dir,
            gateway_max_body_mb=1,
            gateway_admin_max_body_mb=4,
            **{f"{name}_url": service_url for name in UPSTREAMS},
        )
        with serve_in_thread(create_app(settings)) as url:
            admin_key = settings.admin_key_file.read_text().strip()
            with httpx2.Client(
                base_url=url, timeout=30, headers={"Authorization": f"Bearer {admin_key}"}
            ) as admin:
                alice, bob = (
                    admin.post("/v1/keys", json={"name": n}).json()["key"] for n in ("alice", "bob")
                )
                mine, theirs = (
                    admin.post(
                        "/v1/jobs",
                        json={"base_model": "loom/tiny", "lora": {"rank": 4}},
                        headers={"Authorization": f"Bearer {key}"},
                    ).json()["id"]
                    for key in (alice, bob)
                )
            yield Gateway(url, admin_key, alice, mine, theirs, seen)


# What a job key must not reach in another key's job, or at all (admin-only), by family:
# (method, service, the target path, a JSON body).
TARGETS = [
    ("GET", "modelstate", f"jobs/{THEIRS}/versions", ""),
    ("GET", "modelstate", f"jobs/{THEIRS}/versions/latest/archive", ""),
    ("GET", "modelstate", f"jobs/{THEIRS}/versions/1/files/adapter_model.safetensors", ""),
    ("PUT", "modelstate", f"jobs/{THEIRS}/aliases/stolen", '{"version": 1}'),
    ("DELETE", "modelstate", f"jobs/{THEIRS}/versions/1", ""),
    ("PUT", "modelstate", "pins/holder", '{"versions": []}'),
    ("GET", "trainer", f"models/{THEIRS}/checkpoints", ""),
    ("POST", "trainer", f"models/{THEIRS}/save_state", '{"name": "c"}'),
    ("POST", "trainer", f"models/{THEIRS}/reset_optimizer", ""),
    ("DELETE", "trainer", f"models/{THEIRS}/checkpoints/c", ""),
    ("POST", "trainer", "models", f'{{"job_id": "x", "base_model": "{THEIRS}"}}'),
    ("POST", "sandbox", "sessions", f'{{"job_id": "{THEIRS}"}}'),
    ("PUT", "reward", "functions/f", f'{{"job_id": "{THEIRS}", "code": "x"}}'),
    ("POST", "rollout", "load", '{"version": "latest"}'),
]
# A path each service opens to a job key (its own job, or a capability id), to climb out of.
ENTRY = {
    "modelstate": f"jobs/{MINE}",
    "trainer": f"models/{MINE}",
    "sandbox": "sessions/s1",
    "reward": "functions/f",
    "rollout": "trajectories/t1",
}
DOTS = ["..", "%2e%2e", "%2E%2E", ".%2e", "%2E.", "%2e%2E"]


def spellings(service: str, target: str) -> list[str]:
    """Paths that a server which resolves dot segments (or decodes `%2F`) reads as `target`."""
    entry = ENTRY[service]
    up = entry.count("/") + 1
    variants = [f"{entry}/" + "/".join([dots] * up) + f"/{target}" for dots in DOTS]
    variants += [
        f"{entry}/./" + "/".join([".."] * up) + f"/{target}",  # a '.' segment on the way
        entry.replace("/", "%2F") + "%2F..%2F" * up + target.replace("/", "%2F"),
        entry.replace("/", "%2f") + "%2f..%2f" * up + target,  # lower-case encoded slashes
        f"{entry}/" + "%2e%2e%2f" * up + target,
        f"{entry}/" + "..%5c" * up + target,
        f"{target}/.",
        f"{target}/%2e",
        f"{target}/..",
        f"{target}/",  # trailing dot / slash
        target.replace("/", "//", 1) if "/" in target else f"/{target}",
    ]
    return variants


@pytest.mark.parametrize(("method", "service", "target", "body"), TARGETS)
def test_no_spelling_reaches_what_the_key_may_not(
    gateway: Gateway, method: str, service: str, target: str, body: str
) -> None:
    def fill(text: str) -> str:
        return text.replace(MINE, gateway.mine).replace(THEIRS, gateway.theirs)

    before = len(gateway.seen.arrived)
    direct = gateway.raw(
        method, f"/v1/{service}/{fill(target)}", gateway.alice, fill(body).encode()
    )
    assert direct[0] in (403, 404), direct
    for path in spellings(service, target):
        full = f"/v1/{service}/{fill(path)}"
        status, answer = gateway.raw(method, full, gateway.alice, fill(body).encode())
        assert 400 <= status < 500, (full, status, answer)
        assert b'"error"' in answer, answer
    assert gateway.seen.arrived[before:] == []  # refused at the gateway: nothing changed


def test_the_own_job_is_reached_at_its_canonical_path(gateway: Gateway) -> None:
    status, answer = gateway.raw(
        "GET",
        f"/v1/modelstate/jobs/{gateway.mine}/versions/%6Catest/files/a%20b.json",
        gateway.alice,
    )
    assert status == 200, answer
    assert gateway.seen.arrived[-1] == (
        "GET",
        f"/v1/jobs/{gateway.mine}/versions/latest/files/a%20b.json",
    )


def test_ids_in_paths_follow_one_pattern(gateway: Gateway) -> None:
    for bad in ("-job", "job%20x", "job~1", "j" * 129):
        status, answer = gateway.raw("GET", f"/v1/modelstate/jobs/{bad}/versions", gateway.alice)
        assert status == 400, (bad, status, answer)
        assert b"is not a job id" in answer


def test_a_repeated_job_id_in_the_query_is_refused(gateway: Gateway) -> None:
    status, answer = gateway.raw(
        "GET", f"/v1/reward/functions?job_id={gateway.mine}&job_id={gateway.theirs}", gateway.alice
    )
    assert status == 400 and b"more than once" in answer, answer


def test_bodies_are_capped_per_key_class(gateway: Gateway) -> None:
    two_mb = b"[" + b"0," * (1 << 20) + b"0]"
    path = f"/v1/trainer/models/{gateway.mine}/forward_backward"
    before = len(gateway.seen.arrived)
    status, answer = gateway.raw("POST", path, gateway.alice, two_mb)
    assert status == 413 and b"limited to 1 MiB" in answer, answer
    assert gateway.seen.arrived[before:] == []  # refused from its Content-Length
    status, answer = gateway.raw("POST", path, gateway.admin_key, two_mb)
    assert status == 200 and gateway.seen.completed[-1][2] == len(two_mb), answer
    status, answer = gateway.raw("POST", path, gateway.admin_key, two_mb * 3)
    assert status == 413 and b"limited to 4 MiB" in answer, answer


def test_a_chunked_body_past_the_cap_is_cut_off(gateway: Gateway) -> None:
    completed = len(gateway.seen.completed)

    def chunks() -> Iterator[bytes]:
        for _ in range(40):
            yield b"x" * 65536  # 2.5 MiB in all, no Content-Length

    with httpx2.Client(
        base_url=gateway.url, timeout=30, headers={"Authorization": f"Bearer {gateway.alice}"}
    ) as client:
        response = client.post(
            f"/v1/trainer/models/{gateway.mine}/forward_backward", content=chunks()
        )
    assert response.status_code == 413, response.text
    assert len(gateway.seen.completed) == completed  # the service never got a whole body


segments = st.lists(
    st.sampled_from(
        [
            *"aZ09._-~@:;=+!$&'()*,",
            "%20",
            "%C3%A9",
            "%2e",
            "%2E",
            "%2f",
            "%5C",
            "%00",
            "%ff",
            "%41",
            "..",
            "%3F",
        ]
    ),
    max_size=6,
).map("".join)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(segments, min_size=1, max_size=5))
def test_the_service_receives_byte_for_byte_the_path_the_gateway_checked(
    gateway: Gateway, parts: list[str]
) -> None:
    raw_path = "/v1/reward/" + "/".join(parts)
    status, answer = gateway.raw("GET", raw_path, gateway.admin_key)
    try:
        checked = proxy_target(raw_path, 2, "").target
    except BadRequest:
        assert status == 400, (raw_path, answer)
        return
    assert status == 200, (raw_path, answer)
    assert gateway.seen.arrived[-1] == ("GET", checked)


async def test_the_sdk_sends_dot_refs_as_values_and_gets_a_clear_400(gateway: Gateway) -> None:
    async with AsyncLoomClient(gateway.url, gateway.alice) as client:
        job = await client.get_job(gateway.mine)
        before = len(gateway.seen.arrived)
        for ref in ("..", "."):
            with pytest.raises(BadRequest, match="are not resolved"):
                await job.version(ref)
        assert gateway.seen.arrived[before:] == []
