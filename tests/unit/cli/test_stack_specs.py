"""The local stack's start-up limits: services whose start is slow by nature get their own."""

from __future__ import annotations

from cli.supervisor import STACK, ServiceSpec


def _spec(name: str) -> ServiceSpec:
    return next(spec for spec in STACK if spec.name == name)


def test_a_sharded_trainer_has_time_to_start_its_ranks() -> None:
    # LOOM_TRAINER_WORLD_SIZE=2 on a loaded 2-core machine: the trainer's own imports took
    # 38-44 s and its two ranks had not joined their group by the default 60 s, so `loom demo`
    # stopped the stack before the first step.
    assert _spec("trainer").startup_timeout_s >= 300.0
