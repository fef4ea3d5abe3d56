"""Which proxied calls a job key may make: every route of every service is classified, so a
new endpoint stays admin-only until someone decides otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.routing import APIRoute

from gateway.auth.scopes import job_named, jobs_named, parse_body, rule_for
from modelstate.app import create_app as modelstate_app
from modelstate.settings import ModelStateSettings
from services.common.errors import Forbidden, InvalidInput
from services.reward.app import create_app as reward_app
from services.reward.settings import RewardSettings
from services.rollout.app import create_app as rollout_app
from services.rollout.settings import RolloutSettings
from services.sandbox.app import create_app as sandbox_app
from services.sandbox.settings import SandboxSettings
from services.trainer.app import create_app as trainer_app
from services.trainer.settings import TrainerSettings

# Routes only admin keys reach: store-wide state, and jobs' models made through /v1/jobs.
ADMIN_ONLY = {
    ("modelstate", "POST", "/versions"),
    ("modelstate", "GET", "/store"),
    ("modelstate", "GET", "/blobs/{sha256}"),
    ("modelstate", "PUT", "/blobs/{sha256}"),
    ("modelstate", "GET", "/pins"),
    ("modelstate", "PUT", "/pins/{holder}"),
    ("modelstate", "DELETE", "/pins/{holder}"),
    ("modelstate", "POST", "/gc"),
    ("rollout", "GET", "/versions"),
    ("rollout", "POST", "/load"),
    ("rollout", "GET", "/models"),
    ("rollout", "POST", "/drain"),
    ("rollout", "GET", "/blobs/{sha256}"),
    ("trainer", "POST", "/models"),
}


def service_routes(tmp_path: Path) -> set[tuple[str, str, str]]:
    apps = {
        "modelstate": modelstate_app(ModelStateSettings(data_dir=tmp_path)),
        "reward": reward_app(RewardSettings(data_dir=tmp_path)),
        "rollout": rollout_app(RolloutSettings(data_dir=tmp_path)),
        "sandbox": sandbox_app(SandboxSettings(data_dir=tmp_path)),
        "trainer": trainer_app(TrainerSettings(data_dir=tmp_path)),
    }
    return {
        (service, method, route.path.removeprefix("/v1"))
        for service, app in apps.items()
        for route in app.routes
        if isinstance(route, APIRoute) and route.path.startswith("/v1/")
        for method in route.methods
    }


def test_every_service_route_is_classified(tmp_path: Path) -> None:
    routes = service_routes(tmp_path)
    assert len(routes) > 40
    # A concrete path for each template: `{job_id}` and friends become one segment.
    unruled = {
        (service, method, path)
        for service, method, path in routes
        if rule_for(
            service, method, path.replace("{path:path}", "a/b").replace("{", "").replace("}", "")
        )
        is None
    }
    assert unruled == ADMIN_ONLY


@pytest.mark.parametrize(
    ("service", "method", "path", "query", "body", "job"),
    [
        ("trainer", "POST", "/models/job_a/forward_backward", {}, None, "job_a"),
        ("trainer", "PUT", "/models/job_a/checkpoints/step_1/expiry", {}, None, "job_a"),
        ("trainer", "GET", "/operations/op_1", {}, None, None),
        ("modelstate", "GET", "/jobs/job_a/versions/3/archive", {}, None, "job_a"),
        ("modelstate", "GET", "/events", {"job_id": "job_a"}, None, "job_a"),
        ("rollout", "POST", "/sample", {}, {"job_id": "job_a"}, "job_a"),
        ("rollout", "POST", "/sample", {}, {"prompt": "1+1="}, None),  # the base model
        ("rollout", "POST", "/sample/batch", {}, {"job_id": "job_a", "prompts": ["1+"]}, "job_a"),
        ("rollout", "POST", "/chat/completions", {}, {"model": "job_a@best"}, "job_a"),
        ("rollout", "POST", "/completions", {}, {"model": "base"}, None),
        ("reward", "POST", "/score", {}, {"params": {"job_id": "job_a"}}, "job_a"),
        ("reward", "POST", "/score", {}, {"verifier": "math"}, None),
        ("reward", "PUT", "/functions/f", {}, {"job_id": "job_a", "code": ""}, "job_a"),
        ("reward", "GET", "/functions", {}, None, None),
        ("sandbox", "POST", "/sessions", {}, {"job_id": "job_a"}, "job_a"),
        ("sandbox", "PUT", "/sessions/sbx_1/files", {}, None, None),
    ],
)
def test_the_job_a_call_acts_on(
    service: str, method: str, path: str, query: dict[str, str], body: object, job: str | None
) -> None:
    assert job_named(service, method, path, query, body) == job


@pytest.mark.parametrize(
    ("service", "method", "path", "query", "body", "reason"),
    [
        ("modelstate", "POST", "/gc", {}, None, "reserved to admin keys"),
        ("modelstate", "GET", "/events", {}, None, "without a job_id"),
        ("reward", "PUT", "/functions/f", {}, {"code": ""}, "without a job_id"),
        ("reward", "DELETE", "/functions/f", {}, None, "without a job_id"),
        ("trainer", "POST", "/models", {}, {"job_id": "job_a"}, "reserved to admin keys"),
        ("nowhere", "GET", "/x", {}, None, "reserved to admin keys"),
    ],
)
def test_admin_only_calls_are_forbidden_with_a_reason(
    service: str, method: str, path: str, query: dict[str, str], body: object, reason: str
) -> None:
    with pytest.raises(Forbidden, match=reason):
        job_named(service, method, path, query, body)


def test_bodies_that_hide_their_job_are_refused() -> None:
    with pytest.raises(InvalidInput, match="job_id must be a string"):
        job_named("rollout", "POST", "/sample", {}, {"job_id": ["job_a"]})
    with pytest.raises(InvalidInput, match="not valid JSON"):
        parse_body(b'{"job_id": ')
    # Duplicate keys: what is checked is what is forwarded (the proxy re-encodes the body).
    body = parse_body(b'{"job_id": "mine", "job_id": "theirs"}')
    assert job_named("rollout", "POST", "/sample", {}, body) == "theirs"
    assert json.loads(json.dumps(body)) == {"job_id": "theirs"}


def test_a_load_of_another_jobs_checkpoint_needs_both_jobs() -> None:
    path = "/models/job_a/load_state"
    assert jobs_named("trainer", "POST", path, {}, {"name": "c"}) == ["job_a"]
    assert jobs_named("trainer", "POST", path, {}, {"name": "c", "job_id": "job_a"}) == ["job_a"]
    assert jobs_named("trainer", "POST", path, {}, {"name": "c", "job_id": "job_b"}) == [
        "job_a",
        "job_b",
    ]
    assert jobs_named("rollout", "POST", "/sample", {}, {"job_id": "job_a"}) == ["job_a"]
    with pytest.raises(InvalidInput, match="job_id must be a string"):
        jobs_named("trainer", "POST", path, {}, {"name": "c", "job_id": ["job_b"]})


def test_a_score_batch_needs_every_job_its_batches_name() -> None:
    def batch(job_id: object = None) -> dict[str, object]:
        params = {} if job_id is None else {"function": "f", "job_id": job_id}
        return {"verifier": "python", "params": params, "items": [{"response": "x"}]}

    named = jobs_named(
        "reward",
        "POST",
        "/score/batch",
        {},
        {"batches": [batch("job_a"), batch(), batch("job_b"), batch("job_a")]},
    )
    assert named == ["job_a", "job_b"]
    assert jobs_named("reward", "POST", "/score/batch", {}, {"batches": [batch()]}) == []
    assert jobs_named("reward", "POST", "/score/batch", {}, {"batches": "x"}) == []
    with pytest.raises(InvalidInput, match="job_id must be a string"):
        jobs_named("reward", "POST", "/score/batch", {}, {"batches": [batch(["job_b"])]})
