"""Verifiers that run code: in the sandbox service, never inside the reward process.

- `code`: the candidate program (the response's last fenced code block, or all of it) against
  tests. Every top-level `assert` of the tests (the item's reference, or `params.tests`) is one
  test, run in its own sandbox after the candidate and the tests' other statements (imports,
  helpers); the reward is the fraction that pass. A test passes when the program ends with
  status ok and prints a per-run random token after the assertion, so a candidate that exits
  early (`exit(0)`, `os._exit(0)`) passes nothing. (A candidate that reads its own harness to
  find the token could still forge it: this stops accidents and lazy hacks, not an adversary.)
- `python`: a reward function the job supplies (`def reward(response, reference)` returning a
  number, or a number and a dict of details), run in the sandbox once per item, so a function
  that crashes or hangs costs only its own item.
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import Field, field_validator, model_validator

from services.common.schemas import StrictModel
from services.reward.schemas import FUNCTION_NAME, JOB_ID, compiles, defines_reward
from services.sandbox.schemas import ExecuteRequest, ExecuteResponse, FileIn

Score = tuple[float, dict[str, Any]]
RunInSandbox = Callable[[ExecuteRequest], Awaitable[ExecuteResponse]]

FENCED = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


# --- code --------------------------------------------------------------------------------------


class CodeParams(StrictModel):
    tests: str | None = Field(
        default=None,
        max_length=200_000,
        description="Python test code (each top-level assert is a test); default: the item's "
        "reference.",
    )
    timeout_s: float = Field(default=5.0, gt=0, le=60, description="Per test.")
    memory_mb: int = Field(default=256, ge=16, le=4096, description="Per test.")

    @field_validator("tests")
    @classmethod
    def _valid(cls, tests: str | None) -> str | None:
        if tests is not None:
            split_tests(compiles(tests, "params.tests"))
        return tests


def candidate_program(response: str) -> str:
    """The last fenced code block of a chat answer, or the whole response."""
    blocks = FENCED.findall(response)
    return blocks[-1] if blocks else response


def split_tests(source: str) -> tuple[str, list[str]]:
    """(setup, tests): each top-level assert is a test; everything else is shared setup."""
    module = ast.parse(source)
    setup = [node for node in module.body if not isinstance(node, ast.Assert)]
    tests = [ast.unparse(node) for node in module.body if isinstance(node, ast.Assert)]
    if not tests:
        raise ValueError("the tests contain no top-level assert")
    return ast.unparse(ast.Module(body=setup, type_ignores=[])), tests


async def score_code(
    run: RunInSandbox, response: str, reference: str | None, params: CodeParams
) -> Score:
    setup, tests = split_tests(compiles(params.tests or reference or "", "the tests"))
    program = candidate_program(response)
    try:
        ast.parse(program)
    except SyntaxError as exc:
        return 0.0, {"passed": 0, "total": len(tests), "error": f"SyntaxError: {exc.msg}"}

    async def run_test(test: str) -> dict[str, Any]:
        token = secrets.token_hex(16)
        code = f"{program}\n\n{setup}\n{test}\nprint({token!r})\n"
        result = await run(
            ExecuteRequest(
                code=code,
                timeout_s=params.timeout_s,
                memory_mb=params.memory_mb,
                max_output_bytes=4096,
            )
        )
        passed = result.status.value == "ok" and result.stdout.rstrip().endswith(token)
        outcome = {"test": test, "passed": passed, "status": result.status.value}
        if not passed:
            outcome["stderr"] = result.stderr[-500:]
        return outcome

    outcomes = await asyncio.gather(*(run_test(test) for test in tests))
    passed = sum(o["passed"] for o in outcomes)
    return passed / len(tests), {"passed": passed, "total": len(tests), "tests": outcomes}


# --- python (a job's own reward function) ------------------------------------------------------

HARNESS = """
import json, math, numbers
import reward_fn
item = json.load(open("item.json"))
value = reward_fn.reward(item["response"], item["reference"])
detail = {}
if isinstance(value, tuple):
    value, detail = value
if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
    raise TypeError(f"reward() must return a finite number, got {value!r}")
json.dump({"reward": float(value), "detail": detail}, open("result.json", "w"))
"""


class PythonParams(StrictModel):
    code: str | None = Field(
        default=None,
        max_length=200_000,
        description="Python source defining reward(response, reference) -> float or "
        "(float, dict); runs in the sandbox. Or name a registered `function`.",
    )
    function: str | None = Field(
        default=None,
        pattern=FUNCTION_NAME,
        description="A reward function registered with PUT /v1/functions/{name}.",
    )
    job_id: str | None = Field(
        default=None, pattern=JOB_ID, description="Whose registered `function` (none: shared)."
    )
    timeout_s: float = Field(default=10.0, gt=0, le=120, description="Per item.")
    memory_mb: int = Field(default=512, ge=16, le=4096, description="Per item.")

    @field_validator("code")
    @classmethod
    def _defines_reward(cls, code: str | None) -> str | None:
        return None if code is None else defines_reward(code, "params.code")

    @model_validator(mode="after")
    def _one_source(self) -> PythonParams:
        if (self.code is None) == (self.function is None):
            raise ValueError("give exactly one of params.code and params.function")
        return self


async def score_python(
    run: RunInSandbox, response: str, reference: str | None, params: PythonParams
) -> Score:
    """`params.code` must be set: a registered function is looked up before scoring."""
    assert params.code is not None
    item = json.dumps({"response": response, "reference": reference})
    result = await run(
        ExecuteRequest(
            code=HARNESS,
            timeout_s=params.timeout_s,
            memory_mb=params.memory_mb,
            files=[
                FileIn(path="reward_fn.py", content=params.code),
                FileIn(path="item.json", content=item),
            ],
            collect=["result.json"],
            max_output_bytes=8192,
        )
    )
    if result.status.value != "ok":
        last_line = (result.stderr.strip().splitlines() or [result.status.value])[-1]
        raise RuntimeError(f"the reward function failed ({result.status.value}): {last_line}")
    answer = json.loads(result.files[0].data())
    return float(answer["reward"]), dict(answer["detail"])
