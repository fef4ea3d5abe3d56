"""LoRA adapters resident in the engine: several versions at once (off-policy samples stay
cheap), least recently used evicted beyond capacity, never one a sample is using."""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Protocol

from vllm.lora.request import LoRARequest


class LoraEngine(Protocol):
    async def add_lora(self, lora_request: LoRARequest) -> None: ...

    async def remove_lora(self, lora_int_id: int) -> None: ...


@dataclass
class _Slot:
    request: LoRARequest
    users: int = 0


class LoraSlots:
    def __init__(self, engine: LoraEngine, capacity: int) -> None:
        self.engine = engine
        self.capacity = capacity
        self._slots: OrderedDict[str, _Slot] = OrderedDict()
        # vLLM keys its prefix cache by the int id: never reuse one for other weights.
        self._ids = itertools.count(1)
        self.lock = asyncio.Lock()

    @property
    def resident(self) -> list[str]:
        """Adapter names, least recently used first."""
        return list(self._slots)

    @asynccontextmanager
    async def use(self, name: str, path: str) -> AsyncIterator[LoRARequest]:
        """The adapter's request, kept resident while the block runs."""
        async with self.lock:
            slot = await self._ensure(name, path)
            slot.users += 1
        try:
            yield slot.request
        finally:
            slot.users -= 1

    async def ensure(self, name: str, path: str) -> LoRARequest:
        """Load (or touch) an adapter without using it: pre-loading on publish."""
        async with self.lock:
            return (await self._ensure(name, path)).request

    def forget_all(self) -> None:
        """The engine dropped every adapter (full weights were replaced). Call under `lock`."""
        self._slots.clear()

    async def _ensure(self, name: str, path: str) -> _Slot:
        slot = self._slots.get(name)
        if slot is not None:
            self._slots.move_to_end(name)
            return slot
        request = LoRARequest(lora_name=name, lora_int_id=next(self._ids), lora_path=path)
        await self.engine.add_lora(request)
        slot = self._slots[name] = _Slot(request)
        await self._evict_beyond_capacity(keep=name)
        return slot

    async def _evict_beyond_capacity(self, keep: str) -> None:
        for name, slot in list(self._slots.items()):
            if len(self._slots) <= self.capacity:
                return
            if name != keep and slot.users == 0:
                del self._slots[name]
                await self.engine.remove_lora(slot.request.lora_int_id)
