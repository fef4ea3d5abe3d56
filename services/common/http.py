"""Service-to-service HTTP: pooled httpx2 clients, timeouts, retries with backoff on idempotent
calls only, and upstream error envelopes turned back into typed errors."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx2

from services.common.errors import LoomError, Unavailable, UpstreamError, error_from_envelope
from services.common.http_pool import pooled_transport
from services.common.logs import request_id_var

log = logging.getLogger(__name__)

IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
DEFAULT_TIMEOUT = httpx2.Timeout(connect=5.0, read=300.0, write=300.0, pool=30.0)
# Idle pooled connections are dropped after this; servers keep them longer (see serve.py).
CLIENT_KEEP_ALIVE_S = 5.0
# Every connection may stay pooled while idle (for at most CLIENT_KEEP_ALIVE_S): a client that
# sends bursts of requests reuses them instead of reconnecting most of them on each burst.
LIMITS = httpx2.Limits(max_connections=100, max_keepalive_connections=100,
                       keepalive_expiry=CLIENT_KEEP_ALIVE_S)


class ServiceClient:
    """An async client for one Loom service; errors come back as `LoomError` subclasses."""

    def __init__(
        self,
        base_url: str,
        *,
        service: str,
        timeout: httpx2.Timeout = DEFAULT_TIMEOUT,
        retries: int = 3,
        transport: httpx2.AsyncBaseTransport | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.service = service
        self.retries = retries
        self.http = httpx2.AsyncClient(
            base_url=base_url.rstrip("/"),
            timeout=timeout,
            transport=transport or pooled_transport(LIMITS),
            headers=headers,
        )

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx2.Response:
        attempts = self.retries + 1 if method.upper() in IDEMPOTENT else 1
        # Outside a request (an SDK script) there is no id to pass on ("-"): the service the
        # call reaches makes one (its trace id when tracing).
        request_id = request_id_var.get()
        headers = {**({"X-Request-ID": request_id} if request_id != "-" else {}),
                   **kwargs.pop("headers", {})}
        for attempt in range(attempts):
            try:
                response = await self.http.request(method, path, headers=headers, **kwargs)
            except httpx2.TransportError as exc:
                if attempt + 1 < attempts:
                    await asyncio.sleep(0.2 * 2**attempt)
                    continue
                raise Unavailable(
                    f"{self.service} is unreachable at {self.http.base_url}: {exc!r}"
                ) from exc
            if response.status_code in (502, 503, 504) and attempt + 1 < attempts:
                await asyncio.sleep(0.2 * 2**attempt)
                continue
            self.raise_for_status(response)
            return response
        raise AssertionError("unreachable")

    def raise_for_status(self, response: httpx2.Response) -> None:
        raise_for_envelope(response, self.service)

    async def get_json(self, path: str, **kwargs: Any) -> Any:
        return (await self.request("GET", path, **kwargs)).json()

    async def post_json(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        return (await self.request("POST", path, json=body, **kwargs)).json()

    async def aclose(self) -> None:
        await self.http.aclose()


def envelope_error(response: httpx2.Response) -> LoomError:
    """The typed error an error response's envelope describes."""
    try:
        body = response.json()
    except ValueError:
        body = response.text
    return error_from_envelope(response.status_code, body)


def raise_for_envelope(response: httpx2.Response, service: str) -> None:
    if response.status_code < 400:
        return
    error = envelope_error(response)
    if response.status_code >= 500:
        # Our caller did nothing wrong: report the dependency's fault as an upstream error.
        raise UpstreamError(f"{service}: {error.message}", error.detail)
    raise error
