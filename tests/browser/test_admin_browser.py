"""The web admin in a real browser: log in, watch a job live, read its charts, manage its
versions in a real modelstate, download one, be refused what the key may not do, and see the
rollout replicas the gateway routes to.

Everything the pages show is put there through the public HTTP APIs first (metrics and
samples through the gateway, versions through modelstate), as a training script would.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx2
import pytest

from agents.sdk import LoomClient
from modelstate.schemas import FileRef, PublishRequest, VersionKind
from services.common.ports import free_port
from services.common.service_token import service_headers
from services.common.settings import LoomSettings

if TYPE_CHECKING:
    from tests.browser.conftest import AdminStack

pytestmark = pytest.mark.integration

STEPS = 12
# name -> the chart it must land in
METRICS = {
    "reward": "chart-reward",
    "eval/reward": "chart-eval-reward",
    "loss": "chart-loss",
    "kl": "chart-kl",
    "throughput/samples_per_s": "chart-throughput",
    "grad_norm": "chart-grad-norm",
}


def publish_version(
    stack: AdminStack, job_id: str, step: int, aliases: tuple[str, ...] = ()
) -> int:
    """Publish a two-file version through modelstate's HTTP API (upload blobs, then commit)."""
    files = {
        "adapter_config.json": json.dumps({"r": 8, "step": step}).encode(),
        "adapter_model.safetensors": bytes([step]) * 4096,
    }
    refs = []
    with httpx2.Client(
        base_url=stack.modelstate_url, timeout=30, headers=service_headers(LoomSettings())
    ) as modelstate:
        for name, data in files.items():
            digest = hashlib.sha256(data).hexdigest()
            modelstate.put(
                f"/v1/blobs/{digest}",
                content=data,
                headers={"Content-Type": "application/octet-stream"},
            ).raise_for_status()
            refs.append(FileRef(path=name, sha256=digest, size=len(data)))
        request = PublishRequest(
            job_id=job_id,
            kind=VersionKind.lora,
            base_model="loom/tiny",
            step=step,
            metrics={"reward": step / 10},
            files=refs,
            aliases=list(aliases),
        )
        response = modelstate.post("/v1/versions", json=request.model_dump(mode="json"))
        response.raise_for_status()
        return int(response.json()["number"])


def seed_job(stack: AdminStack, key: str | None = None, name: str = "arith-grpo") -> str:
    """A job with metrics and samples logged through the gateway, as a script would."""
    with stack.api(key) as api:
        job = api.post("/v1/jobs", json={"base_model": "loom/tiny", "name": name})
        assert job.status_code == 201, job.text
        job_id = str(job.json()["id"])
        points = [
            {"step": step, "name": name, "value": value_of(name, step)}
            for name in METRICS
            for step in range(STEPS)
        ]
        api.post(f"/v1/jobs/{job_id}/metrics", json={"points": points}).raise_for_status()
        samples = [
            {
                "step": step,
                "version": step // 4,
                "prompt": f"{step}+7=",
                "completion": str(step + 7),
                "reward": 1.0 if step % 2 else 0.0,
            }
            for step in range(STEPS)
        ]
        api.post(f"/v1/jobs/{job_id}/samples", json={"samples": samples}).raise_for_status()
    return job_id


def value_of(name: str, step: int) -> float:
    curves = {
        "loss": 2.0 / (step + 1),
        "kl": 0.01 * step,
        "eval/reward": 0.04 * step,
        "grad_norm": 1.0 / (1 + step % 4),
    }
    return curves.get(name, 0.05 * step + 0.1)


def log_in(page: Any, stack: AdminStack, key: str, artifacts: Path | None = None) -> None:
    page.goto(f"{stack.url}/admin/jobs")
    page.wait_for_url(re.compile(r"/admin/login"))
    page.fill("#api_key", key)
    if artifacts is not None:
        shoot(page, artifacts, "00-login")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/admin/jobs$"))


def shoot(page: Any, artifacts: Path, name: str) -> None:
    path = artifacts / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")


def test_an_admin_watches_a_job_and_manages_its_versions(
    page: Any, admin_stack: AdminStack, artifacts: Path
) -> None:
    stack = admin_stack
    job_id = seed_job(stack)
    for step in (4, 8, 11):
        publish_version(stack, job_id, step)  # v1, v2, v3; `latest` follows to v3

    log_in(page, stack, stack.admin_key, artifacts)
    row = page.locator(f"tr[data-job='{job_id}']")
    assert "running" in row.inner_text()
    assert f"step {STEPS - 1}" in " ".join(row.inner_text().split())
    # Live progress: a status change made through the API shows up without a reload (htmx).
    with stack.api() as api:
        api.post(f"/v1/jobs/{job_id}/status", json={"status": "paused"}).raise_for_status()
    page.wait_for_selector(f"tr[data-job='{job_id}'] .status-paused", timeout=10_000)
    shoot(page, artifacts, "01-jobs")

    page.click(f"tr[data-job='{job_id}'] a")
    page.wait_for_url(re.compile(f"/admin/jobs/{job_id}$"))
    for slug in sorted(set(METRICS.values())):
        logged = STEPS * sum(1 for chart in METRICS.values() if chart == slug)
        # data-rendered-points is counted by admin.js from the uPlot chart's own data.
        page.locator(f"figure#{slug}[data-rendered-points='{logged}']").wait_for()
        box = page.locator(f"figure#{slug} canvas").first.bounding_box()
        assert box is not None and box["width"] > 100 and box["height"] > 100, slug
    assert "eval/reward" in page.locator("figure#chart-eval-reward .u-legend").inner_text()
    assert page.locator("#samples tbody tr").count() == STEPS
    assert "unavailable" in page.locator("#replicas").inner_text()  # rollout is not running
    shoot(page, artifacts, "02-job")

    # Live charts: a point logged now is drawn by the next refresh, without a reload.
    with stack.api() as api:
        api.post(
            f"/v1/jobs/{job_id}/metrics",
            json={"points": [{"step": STEPS, "name": "loss", "value": 0.1}]},
        ).raise_for_status()
    page.locator(f"figure#chart-loss[data-rendered-points='{STEPS + 1}']").wait_for(timeout=20_000)

    # Promote v1 to `best`: the alias shows up on its row once the form is submitted.
    page.fill("#alias", "best")
    page.select_option("#alias-number", "1")
    page.click("#alias-form button[type=submit]")
    page.wait_for_url(re.compile(r"done=alias"))
    assert "best" in page.locator("tr[data-version='1'] .aliases").inner_text()
    assert "latest" in page.locator("tr[data-version='3'] .aliases").inner_text()
    shoot(page, artifacts, "03-alias-promoted")

    # Deleting an aliased version is refused by modelstate; its message is on the page.
    page.on("dialog", lambda dialog: dialog.accept())
    page.click("tr[data-version='1'] button.danger")
    page.wait_for_selector("#problem")
    assert "alias" in page.locator("#problem").inner_text().lower()
    assert page.locator("tr[data-version='1']").count() == 1
    shoot(page, artifacts, "04-delete-refused")
    # An unaliased, unpinned version goes.
    page.click("tr[data-version='2'] button.danger")
    page.wait_for_url(re.compile(r"done=deleted"))
    assert page.locator("tr[data-version='2']").count() == 0
    # Lineage: v3 was trained from v2, which is gone now; the page says so.
    assert page.locator("tr[data-version='3'] td").nth(1).inner_text() == "v2 (deleted)"

    # Download: the admin streams modelstate's tar with the session cookie.
    link = page.locator("tr[data-version='3'] a[download]").get_attribute("href")
    archive = page.request.get(f"{stack.url}{link}")
    assert archive.status == 200
    with tarfile.open(fileobj=io.BytesIO(archive.body())) as tar:
        names = sorted(Path(n).name for n in tar.getnames())
    assert names == ["adapter_config.json", "adapter_model.safetensors"]

    page.goto(f"{stack.url}/admin/health")
    assert "unreachable" in page.locator("tr[data-service='rollout']").inner_text()
    assert "ready" in page.locator("tr[data-service='modelstate']").inner_text()
    shoot(page, artifacts, "05-health")


def test_forbidden_actions_are_refused(page: Any, admin_stack: AdminStack, artifacts: Path) -> None:
    stack = admin_stack
    admins_job = seed_job(stack, name="admins-job")
    with stack.api() as api:
        user = api.post("/v1/keys", json={"name": "researcher"}).json()
    own_job = seed_job(stack, user["key"], name="own-job")

    log_in(page, stack, user["key"])
    assert page.locator(f"tr[data-job='{own_job}']").count() == 1
    assert page.locator(f"tr[data-job='{admins_job}']").count() == 0
    response = page.goto(f"{stack.url}/admin/jobs/{admins_job}")
    assert response.status == 404
    assert "belongs to another API key" in page.content()
    shoot(page, artifacts, "06-other-keys-job")

    # A form posted without the session's CSRF token changes nothing and says why.
    page.goto(f"{stack.url}/admin/jobs/{own_job}")
    page.evaluate("""() => {
        const form = document.createElement("form");
        form.method = "post";
        form.action = location.pathname + "/aliases";
        for (const [name, value] of [["alias", "best"], ["number", "1"]]) {
            const input = document.createElement("input");
            input.name = name; input.value = value; form.appendChild(input);
        }
        document.body.appendChild(form);
        form.submit();
    }""")
    page.wait_for_selector("text=Request refused")
    assert "CSRF token is missing" in page.content()
    shoot(page, artifacts, "07-csrf-refused")


SFT_STEPS, RL_STEPS, VERSIONS = 30, 8, 25


def run_like_the_demo(stack: AdminStack) -> str:
    """What `loom demo` does, through the SDK: SFT steps (`sft/...`), then RL steps counted
    from 1 again (`rl/...`), a version per checkpoint, aliases, and a job ended by its block."""
    with (
        LoomClient(stack.url, stack.admin_key) as loom,
        loom.create_job("loom/tiny", name="demo-run") as job,
    ):
        for step in range(1, SFT_STEPS + 1):
            job.log_metrics(step, {"sft/loss": 2.0 / step})
        for step in range(1, RL_STEPS + 1):
            job.log_metrics(step, {"rl/reward": 0.4 + step / 100, "rl/loss": 0.1 / step})
        for number in range(1, VERSIONS + 1):
            aliases = {3: ("sft",), 20: ("best",)}.get(number, ())
            publish_version(stack, job.id, number, aliases)
    return str(job.id)


def test_a_finished_run_shows_completed_with_a_step_axis_per_phase_and_paged_versions(
    page: Any, admin_stack: AdminStack, artifacts: Path
) -> None:
    stack = admin_stack
    job_id = run_like_the_demo(stack)

    log_in(page, stack, stack.admin_key)
    row = page.locator(f"tr[data-job='{job_id}']")
    assert "completed" in row.inner_text()
    assert f"rl step {RL_STEPS}" in " ".join(row.inner_text().split())  # not SFT's step 30
    page.click(f"tr[data-job='{job_id}'] a")
    page.wait_for_url(re.compile(f"/admin/jobs/{job_id}$"))
    assert "completed" in page.locator("#summary").inner_text()
    assert [h.get_attribute("data-phase") for h in page.locator("h3.phase").all()] == ["sft", "rl"]
    for slug, points in (
        ("chart-sft-loss", SFT_STEPS),
        ("chart-rl-loss", RL_STEPS),
        ("chart-rl-reward", RL_STEPS),
    ):
        page.locator(f"figure#{slug}[data-rendered-points='{points}']").wait_for()
    assert page.locator("figure#chart-loss").count() == 0  # no chart mixes the two phases
    charts = json.loads(page.locator("#chart-data").inner_text())
    assert charts["chart-rl-loss"]["axis"] == "rl step"
    assert charts["chart-rl-loss"]["data"][0] == list(range(1, RL_STEPS + 1))
    assert charts["chart-sft-loss"]["axis"] == "sft step"
    shoot(page, artifacts, "08-phases")

    # Versions: 20 a page, newest first; the next page has the rest.
    numbers = page.locator("#versions-table tbody tr")
    assert numbers.count() == 20
    assert numbers.first.get_attribute("data-version") == str(VERSIONS)
    assert "page 1 of 2" in page.locator("#versions-pager").inner_text()
    page.click("#versions-next")
    page.wait_for_url(re.compile(r"versions_page=2"))
    assert [r.get_attribute("data-version") for r in numbers.all()] == [
        str(n) for n in range(VERSIONS - 20, 0, -1)
    ]
    page.click("#versions-filter")  # aliased only: latest (v25), best (v20), sft (v3)
    page.wait_for_url(re.compile(r"aliased=true"))
    assert [r.get_attribute("data-version") for r in numbers.all()] == ["25", "20", "3"]
    assert "3 aliased versions" in " ".join(page.locator("#versions-pager").inner_text().split())
    shoot(page, artifacts, "09-aliased-versions")


def test_the_services_page_shows_each_rollout_replica(
    page: Any, admin_stack: AdminStack, artifacts: Path
) -> None:
    """A replica registered by heartbeat (nothing listens at its URL: routing to it fails)
    shows on the services page with what it reported, and the page follows the routing table
    without a reload; the job page lists it; another key sees no table."""
    stack = admin_stack
    job_id = seed_job(stack, name="replicated")
    nowhere = f"http://127.0.0.1:{free_port()}"
    beat = {
        "url": nowhere,
        "ready": True,
        "heartbeat_s": 60,
        "requests_in_flight": 3,
        "tokens_in_flight": 120,
        "versions": [
            {"job_id": None, "number": 0, "kind": "base"},
            {"job_id": job_id, "number": 2, "kind": "lora"},
        ],
    }
    with stack.api() as api:
        api.put(
            "/v1/internal/replicas/replica-a", json=beat, headers=service_headers(LoomSettings())
        ).raise_for_status()
        user_key = api.post("/v1/keys", json={"name": "researcher"}).json()["key"]

    log_in(page, stack, stack.admin_key)
    page.goto(f"{stack.url}/admin/health")
    row = page.locator("tr[data-replica='replica-a']")
    text = " ".join(row.inner_text().split())
    for shown in (nowhere, "ready", "base", f"{job_id} v2", "3 requests, 120 tokens", "every 60 s"):
        assert shown in text, (shown, text)
    assert row.locator("td.routed").inner_text().strip() == "0"
    assert re.search(r"\d+\.\d s ago", text), text
    assert "ready" in page.locator("tr[data-service='rollout']").inner_text()
    shoot(page, artifacts, "08-replicas")

    # A sample routed to it cannot connect: the table's next refresh shows it set aside,
    # counted as routed once and failed once.
    with stack.api() as api:
        refused = api.post("/v1/rollout/sample", json={"prompt_token_ids": [1, 2]})
        assert refused.status_code == 503, refused.text
    page.wait_for_selector("tr[data-replica='replica-a'] .status-unreachable", timeout=10_000)
    routed = " ".join(row.locator("td.routed").inner_text().split())
    assert routed == "1 1 failed to connect", routed
    shoot(page, artifacts, "09-replica-set-aside")

    page.goto(f"{stack.url}/admin/jobs/{job_id}")
    listed = page.locator("#replicas tr[data-replica='replica-a']").inner_text()
    assert nowhere in listed and "unavailable" in listed  # asked now: nothing listens

    page.context.clear_cookies()
    log_in(page, stack, user_key)
    page.goto(f"{stack.url}/admin/health")
    assert page.locator("#replicas").count() == 0
    assert page.goto(f"{stack.url}/admin/health/replicas").status == 403
