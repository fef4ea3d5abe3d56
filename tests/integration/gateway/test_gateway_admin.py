"""The web admin (/admin) over a real gateway and httpx2: login, sessions, CSRF, isolation.

The stack (conftest) has no modelstate and no rollout listening, so the job page must say so
instead of failing. Browser-level behaviour (charts, htmx, forms) is in tests/browser.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import httpx2
import pytest

if TYPE_CHECKING:
    from tests.integration.gateway.conftest import Stack

pytestmark = pytest.mark.integration

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def browser(stack: Stack) -> httpx2.AsyncClient:
    """A cookie-keeping client with no API key, like a browser."""
    return httpx2.AsyncClient(base_url=stack.url, timeout=30)


async def csrf_of(client: httpx2.AsyncClient, path: str) -> str:
    page = await client.get(path)
    assert page.status_code == 200, page.text
    match = CSRF.search(page.text)
    assert match, page.text
    return match.group(1)


async def log_in(
    client: httpx2.AsyncClient, key: str, next_path: str = "/admin/jobs"
) -> httpx2.Response:
    token = await csrf_of(client, f"/admin/login?next={next_path}")
    return await client.post(
        "/admin/login", data={"api_key": key, "csrf_token": token, "next": next_path}
    )


async def create_job(stack: Stack, key: str | None = None, name: str = "job") -> str:
    async with stack.client(key) as api:
        response = await api.post("/v1/jobs", json={"base_model": "loom/tiny", "name": name})
        assert response.status_code == 201, response.text
        return str(response.json()["id"])


@pytest.fixture
async def user_key(stack: Stack) -> AsyncIterator[tuple[str, str]]:
    """A non-admin key: (id, secret)."""
    async with stack.client() as api:
        created = (await api.post("/v1/keys", json={"name": "researcher"})).json()
    yield created["id"], created["key"]


async def test_pages_need_a_login_and_the_cookie_holds_no_secret(stack: Stack) -> None:
    job_id = await create_job(stack, name="visible-job")
    async with browser(stack) as client:
        response = await client.get("/admin/jobs")
        assert response.status_code == 303
        assert response.headers["location"] == "/admin/login?next=/admin/jobs"

        response = await log_in(client, stack.admin_key)
        assert response.status_code == 303
        assert response.headers["location"] == "/admin/jobs"
        cookie = next(
            c for c in response.headers.get_list("set-cookie") if c.startswith("loom_admin=")
        )
        attributes = {part.strip().lower() for part in cookie.split(";")[1:]}
        assert {"httponly", "samesite=strict", "path=/admin"} <= attributes
        assert stack.admin_key not in cookie
        assert stack.admin_key.removeprefix("loom_") not in cookie

        page = await client.get("/admin/jobs")
        assert page.status_code == 200
        assert "visible-job" in page.text and job_id in page.text
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["cache-control"] == "no-store"


async def test_a_bad_key_is_refused(stack: Stack) -> None:
    async with browser(stack) as client:
        response = await log_in(client, "loom_not-a-real-key")
        assert response.status_code == 401
        assert "not valid" in response.text
        assert "loom_admin" not in client.cookies
        assert (await client.get("/admin/jobs")).status_code == 303


async def test_forms_without_a_valid_csrf_token_are_refused(stack: Stack) -> None:
    job_id = await create_job(stack)
    form = {"alias": "best", "number": "1"}
    target = f"/admin/jobs/{job_id}/aliases"
    async with browser(stack) as client, browser(stack) as other:
        await log_in(client, stack.admin_key)
        await log_in(other, stack.admin_key)
        token = await csrf_of(client, f"/admin/jobs/{job_id}")
        foreign = await csrf_of(other, f"/admin/jobs/{job_id}")
        assert token != foreign

        for data in (form, {**form, "csrf_token": foreign}, {**form, "csrf_token": "x"}):
            refused = await client.post(target, data=data)
            assert refused.status_code == 403
            assert "CSRF token is missing or does not belong to your session" in refused.text

        cross_site = await client.post(
            target, data={**form, "csrf_token": token}, headers={"Origin": "http://evil.example"}
        )
        assert cross_site.status_code == 403
        assert "came from another site" in cross_site.text

        # A valid token gets through to modelstate, which is not running: the page says so.
        accepted = await client.post(
            target, data={**form, "csrf_token": token}, headers={"Origin": stack.url}
        )
        assert accepted.status_code == 503
        assert "modelstate is unreachable" in accepted.text

    async with browser(stack) as client:
        await csrf_of(client, "/admin/login")  # a login cookie, but no token in the form
        response = await client.post("/admin/login", data={"api_key": stack.admin_key})
        assert response.status_code == 403
        assert "loom_admin" not in client.cookies


async def test_a_non_admin_key_sees_only_its_own_jobs(
    stack: Stack, user_key: tuple[str, str]
) -> None:
    _, secret = user_key
    mine = await create_job(stack, secret, name="mine")
    theirs = await create_job(stack, name="theirs")
    async with browser(stack) as client:
        await log_in(client, secret)
        listing = await client.get("/admin/jobs/table")
        assert mine in listing.text and theirs not in listing.text
        assert (await client.get(f"/admin/jobs/{mine}")).status_code == 200
        for path in (
            f"/admin/jobs/{theirs}",
            f"/admin/jobs/{theirs}/summary",
            f"/admin/jobs/{theirs}/charts.json",
            f"/admin/jobs/{theirs}/samples",
            f"/admin/jobs/{theirs}/versions/1/download",
        ):
            response = await client.get(path)
            assert response.status_code == 404, path
            assert "belongs to another API key" in response.text
        token = await csrf_of(client, f"/admin/jobs/{mine}")
        response = await client.post(
            f"/admin/jobs/{theirs}/versions/1/delete", data={"csrf_token": token}
        )
        assert response.status_code == 404

    async with browser(stack) as client:
        await log_in(client, stack.admin_key)
        listing = await client.get("/admin/jobs/table")
        assert mine in listing.text and theirs in listing.text


async def test_logout_ends_the_session_even_for_a_copied_cookie(stack: Stack) -> None:
    async with browser(stack) as client:
        await log_in(client, stack.admin_key)
        copied = client.cookies["loom_admin"]
        token = await csrf_of(client, "/admin/jobs")
        response = await client.post("/admin/logout", data={"csrf_token": token})
        assert response.status_code == 303
        assert response.headers["location"] == "/admin/login"
        assert "loom_admin" not in client.cookies
    async with browser(stack) as replay:
        replay.cookies.set("loom_admin", copied, path="/admin")
        assert (await replay.get("/admin/jobs")).status_code == 303


async def test_revoking_the_key_ends_its_sessions(stack: Stack, user_key: tuple[str, str]) -> None:
    key_id, secret = user_key
    async with browser(stack) as client:
        await log_in(client, secret)
        assert (await client.get("/admin/jobs")).status_code == 200
        async with stack.client() as api:
            assert (await api.delete(f"/v1/keys/{key_id}")).status_code == 200
        response = await client.get("/admin/jobs")
        assert response.status_code == 303
        # An htmx poll is told to navigate rather than swap the login page into a fragment.
        poll = await client.get(
            "/admin/jobs/table",
            headers={"HX-Request": "true", "HX-Current-URL": f"{stack.url}/admin/jobs"},
        )
        assert poll.headers["hx-redirect"] == "/admin/login?next=/admin/jobs"


async def test_the_job_page_shows_what_the_job_logged_and_which_services_are_down(
    stack: Stack,
) -> None:
    job_id = await create_job(stack)
    async with stack.client() as api:
        points = [{"step": s, "name": "reward", "value": s / 10} for s in range(3)]
        points += [{"step": 2, "name": "policy_loss", "value": 1.5}]
        assert (
            await api.post(f"/v1/jobs/{job_id}/metrics", json={"points": points})
        ).status_code == 200
        sample = {
            "step": 2,
            "version": 1,
            "prompt": "<b>12+7=</b>",
            "completion": "19",
            "reward": 1.0,
        }
        assert (
            await api.post(f"/v1/jobs/{job_id}/samples", json={"samples": [sample]})
        ).status_code == 200
    async with browser(stack) as client:
        await log_in(client, stack.admin_key)
        page = await client.get(f"/admin/jobs/{job_id}")
        assert page.status_code == 200
        assert re.search(r'data-chart="chart-reward"\s+data-points="3"', page.text)
        assert re.search(r'data-chart="chart-loss"\s+data-points="1"', page.text)
        assert "&lt;b&gt;12+7=&lt;/b&gt;" in page.text  # logged text is escaped
        assert "Versions are unavailable" in page.text and "unreachable" in page.text
        assert "status-unreachable" in page.text  # the rollout replica row

        charts = (await client.get(f"/admin/jobs/{job_id}/charts.json")).json()
        assert charts["chart-reward"]["data"] == [[0, 1, 2], [0.0, 0.1, 0.2]]
        health = await client.get("/admin/health")
        assert health.status_code == 200
        assert re.search(r'data-service="modelstate">.*?status-unreachable', health.text, re.S)
        assert re.search(r'data-service="worker">.*?status-unreachable', health.text, re.S)

        async with stack.client() as api:  # a managed run (no worker here: it stays queued)
            run = await api.post(
                f"/v1/jobs/{job_id}/tasks",
                json={
                    "kind": "recipe",
                    "params": {
                        "recipe": "sft",
                        "config": {
                            "steps": 2,
                            "data": [{"input_ids": [1, 2], "loss_mask": [0, 1]}],
                        },
                    },
                },
            )
            assert run.status_code == 202, run.text
        summary = await client.get(f"/admin/jobs/{job_id}/summary")
        assert re.search(r'id="run">.*?sft.*?status-queued', summary.text, re.S)


async def test_an_invalid_alias_name_is_refused_before_reaching_modelstate(stack: Stack) -> None:
    job_id = await create_job(stack)
    async with browser(stack) as client:
        await log_in(client, stack.admin_key)
        token = await csrf_of(client, f"/admin/jobs/{job_id}")
        response = await client.post(
            f"/admin/jobs/{job_id}/aliases",
            data={"alias": "../versions/1", "number": "1", "csrf_token": token},
        )
        assert response.status_code == 422
        assert "is not an alias name" in response.text


async def test_static_files_are_served_without_a_login(stack: Stack) -> None:
    async with browser(stack) as client:
        response = await client.get("/admin/static/vendor/htmx-2.0.11.min.js")
        assert response.status_code == 200
        assert "htmx" in response.text[:2000]
