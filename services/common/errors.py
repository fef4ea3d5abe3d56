"""One error taxonomy for every Loom service, rendered as one JSON envelope.

Raise these from logic modules; `install_error_handlers` maps them (and FastAPI's own
validation and HTTP errors) to `{"error": {"code", "message", "detail"}}` with the right status.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import ValidationError


class LoomError(Exception):
    """Base class: a fault with a stable machine code and a message a user can act on."""

    status_code: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"

    def __init__(self, message: str, detail: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail


class BadRequest(LoomError):
    """A request the server cannot read as one unambiguous call (a malformed path, say)."""

    status_code = 400
    code = "bad_request"


class InvalidInput(LoomError):
    status_code = 422
    code = "invalid_input"


class Unauthorized(LoomError):
    status_code = 401
    code = "unauthorized"


class Forbidden(LoomError):
    status_code = 403
    code = "forbidden"


class NotFound(LoomError):
    status_code = 404
    code = "not_found"


class Conflict(LoomError):
    status_code = 409
    code = "conflict"


class InvalidTransition(Conflict):
    code = "invalid_transition"


class PayloadTooLarge(LoomError):
    status_code = 413
    code = "payload_too_large"


class LimitExceeded(LoomError):
    """A quota is used up (sessions per job, ...): free something or wait, then retry."""

    status_code = 429
    code = "limit_exceeded"


class UpstreamError(LoomError):
    """A service this one depends on failed or answered with a server error."""

    status_code = 502
    code = "upstream_error"


class Unavailable(LoomError):
    """Temporarily unable to serve (starting up, engine loading); retrying later may work."""

    status_code = 503
    code = "unavailable"


# Every concrete error, most specific first where two share a status code.
_ERRORS: tuple[type[LoomError], ...] = (
    BadRequest,
    InvalidInput,
    Unauthorized,
    Forbidden,
    NotFound,
    InvalidTransition,
    Conflict,
    PayloadTooLarge,
    LimitExceeded,
    UpstreamError,
    Unavailable,
)
_BY_CODE: dict[str, type[LoomError]] = {cls.code: cls for cls in (LoomError,) + _ERRORS}
# By status, the general class wins: it comes later, so it overwrites (Conflict, not
# InvalidTransition).
_BY_STATUS: dict[int, type[LoomError]] = {cls.status_code: cls for cls in _ERRORS}


def invalid_options(exc: ValidationError, what: str, root: str) -> InvalidInput:
    """Options a user gave (a verifier's, an environment's) that failed validation, as one
    message naming each field (`root` names the options object itself)."""
    problems = "; ".join(
        f"{'.'.join(map(str, e['loc'])) or root}: {e['msg']}" for e in exc.errors()
    )
    return InvalidInput(f"{what}: {problems}", exc.errors(include_url=False, include_context=False))


def error_from_envelope(status_code: int, body: Any) -> LoomError:
    """Rebuild a typed error from a response envelope (used by clients and the SDK)."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        message = f"HTTP {status_code}: {str(body)[:500]}"
        cls = _class_for_status(status_code)
        return cls(message)
    cls = _BY_CODE.get(str(error.get("code")), _class_for_status(status_code))
    return cls(str(error.get("message", "")), error.get("detail"))


def _class_for_status(status_code: int) -> type[LoomError]:
    if status_code in _BY_STATUS:
        return _BY_STATUS[status_code]
    return InvalidInput if 400 <= status_code < 500 else LoomError
