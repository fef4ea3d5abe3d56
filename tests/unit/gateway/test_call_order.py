"""An SDK's numbered training calls: every number is used up whatever happens to its call,
so a refused call never stalls the ones after it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gateway.compat.common.calls import CallOrder, numbered
from gateway.compat.common.futures import Futures
from services.common.errors import InvalidInput


async def submitted(order: CallOrder, futures: Futures, seq_id: int, log: list[int]) -> str:
    async def submit() -> int:
        log.append(seq_id)
        return seq_id

    async def result(value: Any) -> dict[str, Any]:
        return {"seq": value}

    return await order.place(futures, seq_id, submit, result)


async def test_a_refused_call_uses_its_number_up_now_or_when_its_turn_comes(
        gateway_db: sessionmaker[Session]) -> None:
    order, futures, log = CallOrder("m"), Futures(gateway_db, "t"), []
    await submitted(order, futures, 1, log)
    await order.skip(2)  # refused at its turn
    await submitted(order, futures, 3, log)
    waiting = asyncio.ensure_future(submitted(order, futures, 5, log))
    await order.skip(6)  # a refusal of a later number is remembered...
    await asyncio.sleep(0.01)
    assert not waiting.done()  # ...but 5 still waits for 4
    await order.skip(4)
    await asyncio.wait_for(waiting, 1)
    assert log == [1, 3, 5] and order.next_seq == 7
    await order.skip(3)  # a number already used: nothing changes
    assert order.next_seq == 7


async def test_a_call_whose_submission_fails_uses_its_number_up(
        gateway_db: sessionmaker[Session]) -> None:
    order, futures = CallOrder("m"), Futures(gateway_db, "t")

    async def refuse() -> str:
        raise InvalidInput("lr must be >= 0")

    async def result(value: Any) -> dict[str, Any]:
        return {}

    with pytest.raises(InvalidInput):
        await order.place(futures, 1, refuse, result)
    await asyncio.wait_for(submitted(order, futures, 2, []), 1)


class Service:
    def __init__(self) -> None:
        self.models = {"m": type("Model", (), {"calls": CallOrder("m")})()}

    @numbered(lambda model_id, seq_id: (model_id, seq_id))
    async def call(self, model_id: str, seq_id: int) -> None:
        raise InvalidInput("loss_fn_config key 'x' is not served")


async def test_a_numbered_service_call_refused_before_its_turn_is_skipped() -> None:
    service = Service()
    with pytest.raises(InvalidInput):
        await service.call("m", 1)
    with pytest.raises(InvalidInput):
        await service.call("missing", 1)  # no such model: nothing to number
    assert service.models["m"].calls.next_seq == 2
