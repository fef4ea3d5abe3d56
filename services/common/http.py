"""Service-to-service HTTP: pooled httpx2 clients, timeouts, retries with backoff on idempotent
calls only, and upstream error envelopes turned back into typed errors.

A service's typed client (`services/<name>/client.py`, `modelstate/client.py`) subclasses
`ServiceClient` and declares each route it calls once, as a `Route` (method, path template,
request and response schema); `tests/unit/contracts` checks every `Route` against the
server's OpenAPI. The same client reaches the service directly or through the gateway's
`/v1/<service>/...` prefix (`through_gateway`), with the service token or a user's key.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar, cast
from urllib.parse import quote

import httpx2
from pydantic import BaseModel

from services.common.errors import LoomError, Unavailable, UpstreamError, error_from_envelope
from services.common.http_pool import pooled_transport
from services.common.logs import request_id_var
from services.common.paths import segment

log = logging.getLogger(__name__)

IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
# A submission that carries this header may be sent again (the server answers a repeat with
# the first submission's result), so it is retried like an idempotent method.
IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
RETRY_STATUSES = frozenset({502, 503, 504})
BACKOFF_S = 0.2
DEFAULT_TIMEOUT = httpx2.Timeout(connect=5.0, read=300.0, write=300.0, pool=30.0)
# Idle pooled connections are dropped after this; servers keep them longer (see serve.py).
CLIENT_KEEP_ALIVE_S = 5.0
# Every connection may stay pooled while idle (for at most CLIENT_KEEP_ALIVE_S): a client that
# sends bursts of requests reuses them instead of reconnecting most of them on each burst.
LIMITS = httpx2.Limits(
    max_connections=100, max_keepalive_connections=100, keepalive_expiry=CLIENT_KEEP_ALIVE_S
)

T = TypeVar("T")
ResponseT = TypeVar("ResponseT", bound=BaseModel | None)


@dataclass(frozen=True)
class Route(Generic[ResponseT]):
    """One route of a service as its client calls it: `path` is the server's template
    (`/v1/models/{model_id}`), `request` the body's schema (None: no body), `response` the
    answer's (None: no JSON answer: 204, or a stream the caller reads itself).
    `whole_paths`: parameters that are paths of their own (a file's), sent with their `/`."""

    method: str
    path: str
    response: type[ResponseT] | None
    request: type[BaseModel] | None = None
    whole_paths: frozenset[str] = frozenset()

    def url(self, **params: object) -> str:
        """The path with each parameter percent-encoded as one segment (or as a path)."""
        return self.path.format(
            **{
                name: quote(str(value)) if name in self.whole_paths else segment(value)
                for name, value in params.items()
            }
        )


async def retrying(
    send: Callable[[], Awaitable[T]],
    attempts: int,
    give_up: Callable[[httpx2.TransportError], LoomError],
    *,
    again: Callable[[T], bool] = lambda _: False,
) -> T:
    """`send()` tried up to `attempts` times with doubling backoff, again after a transport
    error or while `again(result)`; the last transport error becomes `give_up(error)`."""
    for attempt in range(attempts):
        last = attempt + 1 == attempts
        try:
            result = await send()
        except httpx2.TransportError as exc:
            if last:
                raise give_up(exc) from exc
        else:
            if last or not again(result):
                return result
        await asyncio.sleep(BACKOFF_S * 2**attempt)
    raise AssertionError("attempts must be at least 1")


class ServiceClient:
    """An async client for one Loom service; errors come back as `LoomError` subclasses.

    `headers` authenticate it: the service token's (`service_token.client_of`) or a
    user's key (`Authorization: Bearer ...`, through the gateway). `base_url` may instead be
    a pooled client to share (the gateway's upstream pool; its owner closes it): then
    `timeout`, when given, bounds each request, and `transport` and `headers` are its own."""

    SERVICE: ClassVar[str] = ""  # a typed client's service name

    def __init__(
        self,
        base_url: str | httpx2.AsyncClient,
        *,
        service: str | None = None,
        timeout: httpx2.Timeout | None = None,
        retries: int = 3,
        transport: httpx2.AsyncBaseTransport | None = None,
        headers: dict[str, str] | None = None,
        through_gateway: bool = False,
    ) -> None:
        self.service = service or self.SERVICE
        if not self.service:
            raise ValueError("ServiceClient needs the name of the service it calls")
        self.retries = retries
        self.through_gateway = through_gateway
        self.timeout = timeout
        self.http = (
            base_url
            if isinstance(base_url, httpx2.AsyncClient)
            else httpx2.AsyncClient(
                base_url=base_url.rstrip("/"),
                timeout=timeout or DEFAULT_TIMEOUT,
                transport=transport or pooled_transport(LIMITS),
                headers=headers,
            )
        )

    def path(self, path: str) -> str:
        """`path` of the service as this client sends it: through the gateway,
        `/v1/x` is `/v1/<service>/x`."""
        if self.through_gateway and path.startswith("/v1/"):
            return f"/v1/{self.service}/{path.removeprefix('/v1/')}"
        return path

    def _headers(self, headers: dict[str, str]) -> dict[str, str]:
        # Outside a request (an SDK script) there is no id to pass on ("-"): the service the
        # call reaches makes one (its trace id when tracing).
        request_id = request_id_var.get()
        return {**({"X-Request-ID": request_id} if request_id != "-" else {}), **headers}

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx2.Response:
        headers = self._headers(kwargs.pop("headers", {}))
        if self.timeout is not None:
            kwargs.setdefault("timeout", self.timeout)
        retry = method.upper() in IDEMPOTENT or IDEMPOTENCY_KEY_HEADER in headers
        response = await retrying(
            lambda: self.http.request(method, self.path(path), headers=headers, **kwargs),
            self.retries + 1 if retry else 1,
            self.unreachable,
            again=lambda response: response.status_code in RETRY_STATUSES,
        )
        self.raise_for_status(response)
        return response

    async def open(
        self, route: Route[None], *, params: dict[str, Any] | None = None, **path_params: object
    ) -> httpx2.Response:
        """`route`'s answer opened as a stream (a file, an archive): the caller reads and
        closes it. Not retried: the caller decides what a broken stream means."""
        request = self.http.build_request(
            route.method,
            self.path(route.url(**path_params)),
            params=params,
            headers=self._headers({}),
            timeout=httpx2.USE_CLIENT_DEFAULT if self.timeout is None else self.timeout,
        )
        try:
            response = await self.http.send(request, stream=True)
        except httpx2.TransportError as exc:
            raise self.unreachable(exc) from exc
        if response.status_code >= 400:
            await response.aread()
            await response.aclose()
            self.raise_for_status(response)
        return response

    async def call(
        self,
        route: Route[ResponseT],
        body: BaseModel | None = None,
        *,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        **path_params: object,
    ) -> ResponseT:
        """Send `body` to `route` and return its answer as the route's response schema;
        `timeout`: seconds for this call instead of the client's timeouts."""
        if (body is None) != (route.request is None) or (
            body is not None and not isinstance(body, cast(type, route.request))
        ):
            raise TypeError(
                f"{route.method} {route.path} takes {route.request}, not {type(body).__name__}"
            )
        response = await self.request(
            route.method,
            route.url(**path_params),
            params=params,
            headers=headers or {},
            json=None if body is None else body.model_dump(mode="json"),
            **({} if timeout is None else {"timeout": timeout}),
        )
        if route.response is None:
            return cast(ResponseT, None)
        schema = cast(type[BaseModel], route.response)
        return cast(ResponseT, schema.model_validate(response.json()))

    def unreachable(self, exc: httpx2.TransportError) -> LoomError:
        return transport_error(self.service, self.http.base_url, exc)

    def raise_for_status(self, response: httpx2.Response) -> None:
        if self.through_gateway:  # the gateway's envelope already says whose fault it is
            if response.status_code >= 400:
                raise envelope_error(response)
            return
        raise_for_envelope(response, self.service)

    async def get_json(self, path: str, **kwargs: Any) -> Any:
        return (await self.request("GET", path, **kwargs)).json()

    async def post_json(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        return (await self.request("POST", path, json=body, **kwargs)).json()

    async def aclose(self) -> None:
        await self.http.aclose()


def transport_error(service: str, url: object, exc: httpx2.TransportError) -> LoomError:
    """The error a call to `service` that got no answer raises: unreachable when it could not
    connect (nothing was sent), else failed to answer (the request may have been acted on)."""
    if isinstance(exc, httpx2.ConnectError | httpx2.ConnectTimeout):
        return Unavailable(f"{service} is unreachable at {url}: {exc!r}", {"service": service})
    return UpstreamError(f"{service} failed to answer: {exc!r}", {"service": service})


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
