"""The worker pool: deadlines, replacement of a stuck pool, retries of innocent calls."""

from __future__ import annotations

import asyncio
import operator
import os
import time

import pytest

from services.reward.workers import WorkerPool


async def test_calls_run_in_worker_processes() -> None:
    pool = WorkerPool(2)
    try:
        assert await pool.run(30, operator.add, 2, 3) == 5
        assert await pool.run(30, os.getpid) != os.getpid()
    finally:
        await pool.shutdown()


async def test_a_hung_call_times_out_and_the_pool_is_replaced() -> None:
    pool = WorkerPool(2)
    try:
        await pool.ready()
        started = time.monotonic()
        hung, innocent = await asyncio.gather(
            pool.run(0.5, time.sleep, 3600),
            pool.run(30, time.sleep, 1.0),
            return_exceptions=True,
        )
        assert isinstance(hung, TimeoutError)
        assert time.monotonic() - started < 30
        assert innocent is None  # killed with the old pool, retried on the new one
        assert pool.replaced == 1
        assert await pool.run(30, operator.mul, 6, 7) == 42
    finally:
        await pool.shutdown()


async def test_errors_raised_by_the_call_come_back() -> None:
    pool = WorkerPool(1)
    try:
        with pytest.raises(ZeroDivisionError):
            await pool.run(30, operator.truediv, 1, 0)
        assert pool.replaced == 0
    finally:
        await pool.shutdown()
