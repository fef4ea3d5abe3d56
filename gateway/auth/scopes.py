"""What a non-admin key may do through the proxy: only its own jobs' models, versions,
adapters and samples. Admin keys pass untouched.

Every proxied route of a service has one rule here; a route without one is admin-only, so a
new service endpoint is closed to job keys until someone decides otherwise. A rule says where
the request names its job (path, query or JSON body); the caller must own that job. Random,
unguessable ids handed out to their creator (trainer operations, sandbox sessions, captured
trajectories) work as capabilities and are open to any key that holds them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.common.errors import BadRequest, Forbidden, InvalidInput
from services.common.schemas import RESOURCE_ID_PATTERN

# A request body is read whole only for rules that name the job inside it; those requests are
# small (sampling, rollouts, sessions), the big ones (training data) name the job in the path.
# Only non-admin keys' requests are read at all.
MAX_SCOPED_BODY = 16 << 20

JobOf = Callable[[re.Match[str], dict[str, str], Any], Any]
JobsOf = Callable[[re.Match[str], dict[str, str], Any], list[Any]]


@dataclass(frozen=True)
class Rule:
    methods: frozenset[str]
    pattern: re.Pattern[str]
    job_of: JobOf | None  # None: open to any key
    reads_body: bool = False
    job_required: bool = False  # no job named → admin-only (shared, store-wide state)
    also_of: JobsOf | None = None  # other jobs the call reads (the caller must own each too)


def _rule(
    methods: str,
    path: str,
    job_of: JobOf | None = None,
    *,
    body: bool = False,
    required: bool = False,
    also: JobsOf | None = None,
) -> Rule:
    return Rule(frozenset(methods.split()), re.compile(f"^{path}$"), job_of, body, required, also)


def _path(match: re.Match[str], _query: dict[str, str], _body: Any) -> str | None:
    return match["job"]


def _query(match: re.Match[str], query: dict[str, str], _body: Any) -> str | None:
    return query.get("job_id")


def _body(match: re.Match[str], _query: dict[str, str], body: Any) -> str | None:
    return _field(body, "job_id")


def _bodies(match: re.Match[str], query: dict[str, str], body: Any) -> list[Any]:
    return [_body(match, query, body)]


def _score_params(match: re.Match[str], _query: dict[str, str], body: Any) -> str | None:
    return _field(_field(body, "params"), "job_id")


def _batches_params(match: re.Match[str], query: dict[str, str], body: Any) -> list[Any]:
    """The job of each batch's params (whose registered reward function it runs)."""
    batches = _field(body, "batches")
    if not isinstance(batches, list):
        return []
    return [_score_params(match, query, batch) for batch in batches]


def _openai_model(match: re.Match[str], _query: dict[str, str], body: Any) -> str | None:
    """`<job_id>` or `<job_id>@<ref>` names a job; the base model's names name none."""
    model = _field(body, "model")
    if not isinstance(model, str) or model == "base":
        return None
    return model.split("@", 1)[0]


def _field(body: Any, name: str) -> Any:
    return body.get(name) if isinstance(body, dict) else None


SEGMENT = r"[^/]+"
JOB = rf"(?P<job>{SEGMENT})"
ANY_PATH = r"(?:/.*)?"

RULES: dict[str, tuple[Rule, ...]] = {
    "trainer": (
        # A load may name another job, whose checkpoint it reads.
        _rule("POST", rf"/models/{JOB}/load_state", _path, body=True, also=_bodies),
        _rule("GET POST PUT DELETE", rf"/models/{JOB}{ANY_PATH}", _path),
        _rule("GET", rf"/operations/{SEGMENT}"),
    ),
    "modelstate": (
        _rule("GET PUT DELETE", rf"/jobs/{JOB}{ANY_PATH}", _path),
        _rule("GET", "/events", _query, required=True),
    ),
    "rollout": (
        _rule("POST", "/(?:sample|sample/batch|rollouts|trajectories)", _body, body=True),
        _rule("POST", "/(?:chat/)?completions", _openai_model, body=True),
        _rule("POST", "/(?:tokenize|render)"),
        _rule("GET POST DELETE", rf"/trajectories/{SEGMENT}{ANY_PATH}"),
    ),
    "reward": (
        _rule("POST", "/score", _score_params, body=True),
        # Names no job of its own: each batch may name one (and the caller must own each).
        _rule("POST", "/score/batch", body=True, also=_batches_params),
        _rule("GET", "/verifiers"),
        _rule("PUT", rf"/functions/{SEGMENT}", _body, body=True, required=True),
        _rule("GET", rf"/functions(?:/{SEGMENT})?", _query),
        _rule("DELETE", rf"/functions/{SEGMENT}", _query, required=True),
    ),
    "sandbox": (
        _rule("POST", "/execute"),
        _rule("POST", "/sessions", _body, body=True),
        _rule("GET POST PUT DELETE", rf"/sessions/{SEGMENT}{ANY_PATH}"),
    ),
}


def rule_for(service: str, method: str, path: str) -> tuple[Rule, re.Match[str]] | None:
    """The rule for `method path` (the service's own path, after `/v1`), if any."""
    for rule in RULES.get(service, ()):
        match = rule.pattern.match(path)
        if match is not None and method in rule.methods:
            return rule, match
    return None


def parse_body(raw: bytes) -> Any:
    """The JSON body a rule reads (None when empty); anything else is a 422 here, since the
    job it names cannot be checked."""
    try:
        return json.loads(raw) if raw else None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInput(f"The request body is not valid JSON: {exc}") from exc


def single_valued(items: list[tuple[str, str]]) -> dict[str, str]:
    """The query as the rules read it. A repeated `job_id` is refused: which copy the service
    would act on must not be a guess."""
    job_ids = [value for name, value in items if name == "job_id"]
    if len(job_ids) > 1:
        raise BadRequest(
            "The query names job_id more than once; name one job.", {"job_id": job_ids}
        )
    return dict(items)


def jobs_named(service: str, method: str, path: str, query: dict[str, str], body: Any) -> list[str]:
    """Every job a non-admin key's request acts on or reads (none: an open call); the caller
    must own each. Raises Forbidden for calls reserved to admins."""
    job = job_named(service, method, path, query, body)  # Forbidden when no rule applies
    found = rule_for(service, method, path)
    assert found is not None
    rule, match = found
    also = rule.also_of(match, query, body) if rule.also_of is not None else []
    others = [_checked_id(other) for other in also if other is not None]
    return list(dict.fromkeys(j for j in (job, *others) if j is not None))


def job_named(service: str, method: str, path: str, query: dict[str, str], body: Any) -> str | None:
    """The job a non-admin key's request acts on (None: no job, an open call).

    Raises Forbidden for calls reserved to admins."""
    found = rule_for(service, method, path)
    if found is None:
        raise Forbidden(
            f"{method} /v1/{service}{path} is reserved to admin keys; a job key "
            "reaches only its own jobs' models, versions and samples."
        )
    rule, match = found
    if rule.job_of is None:
        return None
    job = rule.job_of(match, query, body)
    if job is not None:
        _checked_id(job)
    if job is None and rule.job_required:
        raise Forbidden(
            f"{method} /v1/{service}{path} without a job_id acts on state shared "
            "by every job and is reserved to admin keys; name one of your jobs."
        )
    return job


def _checked_id(job: Any) -> str:
    if not isinstance(job, str):
        raise InvalidInput("job_id must be a string.")
    if re.fullmatch(RESOURCE_ID_PATTERN, job) is None:
        raise BadRequest(
            f"{job!r} is not a job id: ids are letters, digits, '.', '_' and '-', "
            "starting with a letter or digit, at most 128 characters.",
            {"job_id": job, "pattern": RESOURCE_ID_PATTERN},
        )
    return job
