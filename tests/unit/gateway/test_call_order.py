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
    gateway_db: sessionmaker[Session],
) -> None:
    order, futures, log = CallOrder("m"), Futures(gateway_db, "t"), []
    await submitted(order, futures, 1, log)
    await order.skip(futures, 2)  # refused at its turn
    await submitted(order, futures, 3, log)
    waiting = asyncio.ensure_future(submitted(order, futures, 5, log))
    await order.skip(futures, 6)  # a refusal of a later number is remembered...
    await asyncio.sleep(0.01)
    assert not waiting.done()  # ...but 5 still waits for 4
    await order.skip(futures, 4)
    await asyncio.wait_for(waiting, 1)
    assert log == [1, 3, 5] and order.next_seq == 7
    await order.skip(futures, 3)  # a number already used: nothing changes
    assert order.next_seq == 7


async def test_a_call_whose_submission_fails_uses_its_number_up(
    gateway_db: sessionmaker[Session],
) -> None:
    order, futures = CallOrder("m"), Futures(gateway_db, "t")

    async def refuse() -> str:
        raise InvalidInput("lr must be >= 0")

    async def result(value: Any) -> dict[str, Any]:
        return {}

    with pytest.raises(InvalidInput):
        await order.place(futures, 1, refuse, result)
    await asyncio.wait_for(submitted(order, futures, 2, []), 1)


class Service:
    def __init__(self, futures: Futures) -> None:
        self.futures = futures
        self.models = {"m": type("Model", (), {"calls": CallOrder("m")})()}

    @numbered(lambda model_id, seq_id: (model_id, seq_id))
    async def call(self, model_id: str, seq_id: int) -> None:
        raise InvalidInput("loss_fn_config key 'x' is not served")


async def test_a_numbered_service_call_refused_before_its_turn_is_skipped(
    gateway_db: sessionmaker[Session],
) -> None:
    service = Service(Futures(gateway_db, "t"))
    with pytest.raises(InvalidInput):
        await service.call("m", 1)
    with pytest.raises(InvalidInput):
        await service.call("missing", 1)  # no such model: nothing to number
    assert service.models["m"].calls.next_seq == 2


async def test_replicas_on_one_database_take_turns_by_the_numbers_each_other_used(
    gateway_db: sessionmaker[Session],
) -> None:
    """One model's calls spread over two gateway replicas (each its own CallOrder and
    Futures): a call waits for the numbers before it, used up on either replica."""
    first, second = Futures(gateway_db, "a"), Futures(gateway_db, "b")
    here, there, log = CallOrder("m"), CallOrder("m", next_seq=0), []
    await submitted(here, first, 1, log)
    await submitted(there, second, 2, log)  # its first call of the model: it starts there
    await there.skip(second, 3)  # refused on the other replica
    assert await asyncio.wait_for(submitted(here, first, 4, log), 5)  # saw 2 and 3 used
    assert log == [1, 2, 4]

    # A number released by a refused submission is claimed again by the resent call.
    async def refuse() -> int:
        raise InvalidInput("lr must be >= 0")

    async def result(value: Any) -> dict[str, Any]:
        return {"seq": value}

    with pytest.raises(InvalidInput):
        await there.place(second, 5, refuse, result)
    resent = await asyncio.wait_for(submitted(here, first, 5, log), 5)
    assert log == [1, 2, 4, 5] and resent == await submitted(there, second, 5, log)
