"""The blocking face cannot drift from the async core: every public method, property and
attribute of an async class has its blocking twin with the same parameters, defaults and
types (the async core's classes read as their blocking faces), and a docstring."""

from __future__ import annotations

import inspect
import re
import warnings
from typing import Any

import pytest

import agents.sdk as sdk
from agents.sdk import (
    AsyncCaptureSession,
    AsyncJobClient,
    AsyncLoomClient,
    AsyncPipeline,
    AsyncRolloutStream,
    AsyncSandboxSession,
    AsyncTask,
    CaptureSession,
    Future,
    JobClient,
    LoomClient,
    OperationFuture,
    Pipeline,
    RolloutStream,
    SandboxSession,
    Task,
)

FACES: list[tuple[type, type]] = [
    (AsyncLoomClient, LoomClient),
    (AsyncJobClient, JobClient),
    (OperationFuture, Future),
    (AsyncTask, Task),
    (AsyncSandboxSession, SandboxSession),
    (AsyncRolloutStream, RolloutStream),
    (AsyncCaptureSession, CaptureSession),
    (AsyncPipeline, Pipeline),
]
BLOCKING_NAMES = {core.__name__: face.__name__ for core, face in FACES} | {
    "AsyncIterator": "Iterator"
}
RENAMED = {
    "aclose": "close",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "__aiter__": "__iter__",
}
# The faces users construct themselves; the others wrap what a call of the core returned.
CONSTRUCTED = {LoomClient, Pipeline}


def blocking(annotation: Any) -> str:
    """An annotation of the async core (a string: `from __future__ import annotations`) as
    the blocking face spells it."""
    return re.sub(r"\w+", lambda word: BLOCKING_NAMES.get(word[0], word[0]), str(annotation))


def members(cls: type, *, core: bool) -> dict[str, str]:
    """Public name (in the face's spelling) -> what it is and its types, e.g.
    `method (self, step: int) -> None` or `property -> str`."""
    spell = blocking if core else str
    found: dict[str, str] = {}
    for name, annotation in _attributes(cls).items():
        if not name.startswith("_"):
            found[name] = f"property -> {spell(annotation)}"
    for name in dir(cls):
        if name.startswith("_") and name not in RENAMED and name not in RENAMED.values():
            continue
        member = inspect.getattr_static(cls, name)
        if isinstance(member, property):
            found[name] = f"property -> {spell(inspect.signature(member.fget).return_annotation)}"
        elif inspect.isfunction(member) and not _inherited_from_object(cls, name):
            kind = "method" if core else _blocking_kind(member)
            found[RENAMED.get(name, name) if core else name] = f"{kind} {_signature(member, spell)}"
    if cls in CONSTRUCTED or (
        core and BLOCKING_NAMES[cls.__name__] in {face.__name__ for face in CONSTRUCTED}
    ):
        found["__init__"] = f"method {_signature(cls.__init__, spell)}"
    return found


def _attributes(cls: type) -> dict[str, Any]:
    """The attributes declared in the class body, its bases' included."""
    return {
        name: annotation
        for base in reversed(cls.__mro__)
        for name, annotation in inspect.get_annotations(base).items()
    }


def _inherited_from_object(cls: type, name: str) -> bool:
    return getattr(object, name, None) is getattr(cls, name)


def _blocking_kind(function: Any) -> str:
    # A coroutine or async generator function in the face would hand the caller something
    # to await: not blocking.
    blocks = not (inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function))
    return "method" if blocks else "ASYNC method"


def _signature(function: Any, spell: Any) -> str:
    signature = inspect.signature(function)
    parameters = [
        parameter.replace(annotation=spell(parameter.annotation))
        if parameter.annotation is not parameter.empty
        else parameter
        for parameter in signature.parameters.values()
    ]
    return str(
        signature.replace(
            parameters=parameters, return_annotation=spell(signature.return_annotation)
        )
    )


def drift(core: type, face: type) -> list[str]:
    """What differs between the async core's class and its blocking face."""
    want, have = members(core, core=True), members(face, core=False)
    return [
        f"{face.__name__}.{name}: core {want.get(name)!r}, face {have.get(name)!r}"
        for name in sorted(want.keys() | have.keys())
        if want.get(name) != have.get(name)
    ]


@pytest.mark.parametrize(("core", "face"), FACES, ids=[face.__name__ for _, face in FACES])
def test_the_blocking_face_has_every_method_of_the_async_core(core: type, face: type) -> None:
    assert drift(core, face) == []


@pytest.mark.parametrize("face", [face for _, face in FACES], ids=lambda face: face.__name__)
def test_every_blocking_method_says_what_it_does(face: type) -> None:
    undocumented = [
        name
        for name, member in vars(face).items()
        if inspect.isfunction(member) and not name.startswith("_") and not member.__doc__
    ]
    assert undocumented == []


def test_a_method_the_face_lacks_or_spells_differently_is_drift() -> None:
    class GrownCore(AsyncJobClient):
        async def pause(self) -> None: ...

        async def sample(self, prompt: str, *, n: int = 2) -> OperationFuture[Any]: ...

    class GrownFace(JobClient):
        async def versions(self) -> list[int]: ...  # type: ignore[override]

    BLOCKING_NAMES[GrownCore.__name__] = GrownFace.__name__
    try:
        found = drift(GrownCore, GrownFace)
    finally:
        del BLOCKING_NAMES[GrownCore.__name__]
    assert [line.split(":")[0] for line in found] == [
        "GrownFace.pause",
        "GrownFace.sample",
        "GrownFace.versions",
    ]
    assert "Future[Any]" in found[1]


def test_the_old_name_of_job_client_still_works_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="JobClient"):
        assert sdk.Job is JobClient
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from agents.sdk import JobClient as _  # noqa: F401  (the new name does not warn)
