"""Web admin logic that needs nothing running: session cookies, CSRF tokens, origins, charts."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gateway.admin.charts import build_charts, panel_of
from gateway.admin.session import SessionSigner, same_origin
from gateway.admin.templating import safe_next
from gateway.auth.middleware import is_public
from gateway.jobs.metric_names import phase_of
from gateway.schemas import MetricSeries

SECRET = b"s" * 32


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def signer(clock: Clock | None = None, secret: bytes = SECRET) -> SessionSigner:
    return SessionSigner(secret, ttl_s=60, clock=clock or Clock())


def test_a_session_cookie_names_the_key_id_and_reads_back() -> None:
    keeper = signer()
    session, cookie = keeper.issue("key_1")
    assert keeper.read(cookie) == session
    assert session.key_id == "key_1"


def flip(text: str, index: int) -> str:
    return text[:index] + ("A" if text[index] != "A" else "B") + text[index + 1 :]


@pytest.mark.parametrize(
    "tamper",
    [
        lambda cookie: flip(cookie, len(cookie) - 3),  # signature changed
        lambda cookie: flip(cookie, 5),  # payload changed
        lambda cookie: cookie.replace(".", ""),  # no signature at all
        lambda cookie: "",
    ],
    ids=["signature", "payload", "unsigned", "empty"],
)
def test_a_tampered_cookie_is_refused(tamper: Callable[[str], str]) -> None:
    keeper = signer()
    _, cookie = keeper.issue("key_1")
    assert keeper.read(tamper(cookie)) is None


def test_a_cookie_signed_with_another_secret_is_refused() -> None:
    _, cookie = signer(secret=b"x" * 32).issue("key_1")
    assert signer().read(cookie) is None


def test_a_session_expires_after_its_lifetime() -> None:
    clock = Clock()
    keeper = signer(clock)
    _, cookie = keeper.issue("key_1")
    clock.now += 59
    assert keeper.read(cookie) is not None
    clock.now += 2
    assert keeper.read(cookie) is None


def test_a_logged_out_session_is_refused_even_when_replayed() -> None:
    keeper = signer()
    session, cookie = keeper.issue("key_1")
    _, other = keeper.issue("key_1")
    keeper.end(session)
    assert keeper.read(cookie) is None
    assert keeper.read(other) is not None


def test_login_and_session_cookies_cannot_stand_in_for_each_other() -> None:
    keeper = signer()
    _, login_cookie = keeper.issue_login_nonce()
    _, session_cookie = keeper.issue("key_1")
    assert keeper.read(login_cookie) is None
    assert keeper.read_login_nonce(session_cookie) is None
    assert keeper.read_login_nonce(login_cookie) is not None


def test_csrf_tokens_are_bound_to_their_session() -> None:
    keeper = signer()
    mine, _ = keeper.issue("key_1")
    theirs, _ = keeper.issue("key_1")
    token = keeper.csrf_token(mine.session_id)
    assert keeper.csrf_valid(mine.session_id, token)
    assert not keeper.csrf_valid(theirs.session_id, token)
    assert not keeper.csrf_valid(mine.session_id, None)
    assert not keeper.csrf_valid(mine.session_id, "")
    assert not keeper.csrf_valid(mine.session_id, token + "x")


def test_a_short_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        SessionSigner(b"short", ttl_s=60)


@pytest.mark.parametrize(
    ("origin", "host", "ok"),
    [
        (None, "127.0.0.1:8000", True),  # no Origin: the token decides
        ("http://127.0.0.1:8000", "127.0.0.1:8000", True),
        ("https://loom.example", "loom.example", True),  # TLS ended by a proxy in front
        ("http://evil.example", "127.0.0.1:8000", False),
        ("http://127.0.0.1:9999", "127.0.0.1:8000", False),
        ("null", "127.0.0.1:8000", False),  # sandboxed frames, data: URLs
    ],
)
def test_same_origin(origin: str | None, host: str, ok: bool) -> None:
    assert same_origin(origin, host) is ok


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/admin/jobs/job_1", "/admin/jobs/job_1"),
        ("https://evil.example/admin", "/admin/"),
        ("//evil.example/admin", "/admin/"),
        ("/admin//evil.example", "/admin/"),
        ("/v1/jobs", "/admin/"),
        (None, "/admin/"),
    ],
)
def test_after_login_only_admin_paths_are_followed(target: str | None, expected: str) -> None:
    assert safe_next(target) == expected


def test_admin_paths_bypass_the_api_key_middleware_and_nothing_else_does() -> None:
    assert is_public("/admin") and is_public("/admin/jobs") and is_public("/admin/static/x")
    assert not is_public("/administrator") and not is_public("/v1/admin")


@pytest.mark.parametrize(
    ("name", "panel"),
    [
        ("reward", "Reward"),
        ("train/reward_mean", "Reward"),
        ("eval/accuracy", "Reward"),
        ("loss", "Loss"),
        ("policy_loss", "Loss"),
        ("kl", "KL"),
        ("kl/mean", "KL"),
        ("ref_kl", "KL"),
        ("throughput/samples_per_s", "Throughput"),
        ("tokens_per_s", "Throughput"),
        ("weekly_lr", None),
        ("lr", None),
        ("grad_norm", None),
    ],
)
def test_metric_names_land_in_the_right_panel(name: str, panel: str | None) -> None:
    assert panel_of(name) == panel


def test_charts_align_series_on_steps_and_count_points() -> None:
    series = [
        MetricSeries(name="reward", steps=[0, 1, 2], values=[0.1, 0.2, 0.3]),
        MetricSeries(name="mean_reward", steps=[0, 2], values=[0.5, 0.6]),
        MetricSeries(name="lr", steps=[0], values=[1e-3]),
        MetricSeries(name="lr.", steps=[0], values=[2e-3]),
    ]
    charts = build_charts(series)
    assert [c.title for c in charts] == ["Reward", "Loss", "KL", "Throughput", "lr", "lr."]
    reward = charts[0].uplot_data()
    assert reward["names"] == ["mean_reward", "reward"]
    assert reward["data"] == [[0, 1, 2], [0.5, None, 0.6], [0.1, 0.2, 0.3]]
    assert reward["points"] == 5 and reward["axis"] == "step"
    assert charts[1].points == 0
    assert len({c.slug for c in charts}) == len(charts)  # element ids stay unique


@pytest.mark.parametrize(
    ("name", "phase"),
    [
        ("sft/loss", "sft"),
        ("rl/reward", "rl"),
        ("eval/accuracy", "eval"),
        ("loss", ""),
        ("kl/mean", ""),
        ("throughput/samples_per_s", ""),
        ("rl/kl/mean", "rl"),
        ("sft/", ""),
    ],
)
def test_a_name_prefix_is_a_phase_unless_it_is_a_panel_word(name: str, phase: str) -> None:
    assert phase_of(name) == phase


def test_each_phase_has_its_own_charts_and_step_axis_in_run_order() -> None:
    series = [
        MetricSeries(name="rl/reward", steps=[1, 2], values=[0.4, 0.5]),
        MetricSeries(name="rl/loss", steps=[1, 2], values=[0.1, 0.0]),
        MetricSeries(name="eval/accuracy", steps=[10], values=[0.6]),
        MetricSeries(name="sft/loss", steps=list(range(1, 1101)), values=[1.0] * 1100),
    ]
    charts = build_charts(series)
    assert [(c.phase, c.title, c.slug) for c in charts] == [
        ("sft", "Loss", "chart-sft-loss"),
        ("rl", "Reward", "chart-rl-reward"),
        ("rl", "Loss", "chart-rl-loss"),
        ("eval", "Reward", "chart-eval-reward"),
    ]
    rl_loss = charts[2].uplot_data()
    assert rl_loss["data"][0] == [1, 2] and rl_loss["axis"] == "rl step"
    assert charts[0].uplot_data()["axis"] == "sft step"
