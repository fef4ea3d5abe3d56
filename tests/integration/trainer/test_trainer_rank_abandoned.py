"""A rank whose coordinator closes the channel mid-command leaves at once: the coordinator
cannot kill a rank on another host, and one stuck in a collective with a dead peer would
otherwise wait for the collective's timeout before its node agent could start it again."""

from __future__ import annotations

import multiprocessing
import time
from multiprocessing.synchronize import Event
from typing import Any

from services.trainer.distributed.rank import serve


class Stuck:
    """Stands in for the rank's registry, whose one model's `work` blocks like a collective
    waiting on a dead peer."""

    def __init__(self, started: Event) -> None:
        self.started = started

    def get(self, model_id: str) -> Stuck:
        return self

    def ping(self) -> str:
        return "pong"

    def work(self) -> None:
        self.started.set()
        time.sleep(120)


def test_a_rank_abandoned_mid_command_exits_at_once() -> None:
    context = multiprocessing.get_context("spawn")
    started = context.Event()
    mine, theirs = context.Pipe()
    rank = context.Process(target=serve, args=(theirs, Stuck(started)))
    rank.start()
    theirs.close()
    command: tuple[Any, ...] = ("call", "model", "ping", ())
    mine.send(command)
    assert mine.recv() == ("ok", "pong")  # answering does not trip it
    mine.send(("call", "model", "work", ()))
    assert started.wait(timeout=120)
    mine.close()
    rank.join(timeout=60)  # `work` would take 120 s
    assert rank.exitcode == 1
