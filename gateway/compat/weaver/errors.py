"""Weaver's error shape, `{"error": code, "message", "retryable", "details"}`, for every
answer under the Weaver prefix (the SDK reads it into `WeaverAPIError`), and the size limit
of Weaver's request bodies."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.types import Message

from gateway.auth.dialects import ClientDialect
from gateway.proxy.request_body import read_capped
from services.common.app_factory import validation_error
from services.common.errors import LoomError

PREFIX = "/weaver"
# Forward/backward batches travel as JSON; a body past this is refused while it streams in.
MAX_BODY_BYTES = 64 << 20


def retryable(exc: LoomError) -> bool:
    """Worth a retry: the service was down or overloaded, not the request wrong."""
    return exc.status_code >= 500 or exc.status_code == 429


def error_response(exc: LoomError) -> JSONResponse:
    body: dict[str, Any] = {"error": exc.code, "message": exc.message, "retryable": retryable(exc)}
    if exc.detail is not None:
        body["details"] = {"detail": exc.detail}
    return JSONResponse(body, status_code=exc.status_code)


# How the SDK presents its key (`WEAVER_API_KEY`, sent as X-Weaver-Api-Key) and reads a 401.
DIALECT = ClientDialect(
    key_header=b"x-weaver-api-key",
    path_prefix=PREFIX + "/",
    error_response=error_response,
    key_hint="Weaver SDK: WEAVER_API_KEY=<key>",
)


class WeaverRoute(APIRoute):
    """Bodies read up to `MAX_BODY_BYTES`; Loom's errors (validation included) answered in
    Weaver's shape."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def shaped(request: Request) -> Response:
            try:
                body = await read_capped(request, MAX_BODY_BYTES)

                async def replay() -> Message:
                    return {"type": "http.request", "body": body, "more_body": False}

                return await handler(Request(request.scope, replay))
            except LoomError as exc:
                return error_response(exc)
            except RequestValidationError as exc:
                return error_response(validation_error(exc))

        return shaped
