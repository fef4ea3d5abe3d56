"""Wire models of the rollout service's own API (the OpenAI-compatible ones live in
`services/rollout/openai/`)."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Annotated, Any, Literal, Self

from pydantic import Field, model_validator

from modelstate.schemas import JobId, VersionNumber
from services.common.schemas import ErrorBody, LenientModel, StrictModel

VersionRef = int | str  # a version number (0 is the base model) or an alias such as "latest"
# The most likely tokens at one position, most likely first: (token id, logprob).
RankedLogprobs = list[tuple[int, float]]
MAX_TOP_LOGPROBS = 20  # vLLM's default max_logprobs
MAX_PROMPT_CHARS = 1_000_000
MAX_PROMPT_TOKENS = 131072
MAX_BATCH_PROMPTS = 1024  # prompts of one batch request (x n samples each)
# Tokens one batch request may ask to sample (prompts x n x max_tokens): what one /v1/sample
# request may ask at its largest (256 x 32768), so a batch holds no more in the service's
# memory than a single request can.
MAX_BATCH_SAMPLE_TOKENS = 256 * 32768


class SamplingParams(StrictModel):
    max_tokens: int = Field(default=64, ge=1, le=32768)
    temperature: float = Field(default=1.0, ge=0, le=10)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=-1, ge=-1)
    stop: list[str] = Field(default=[], max_length=16)
    stop_token_ids: list[int] = Field(default=[], max_length=16)
    seed: int | None = None

    def derived(self, *keys: int) -> SamplingParams:
        """These options with a seed of their own for `keys` (a prompt's index, a step): one
        request seed gives every prompt and step different noise. Hashed over the whole seed
        range rather than added: vLLM seeds a request's n samples seed, seed + 1, ..., so
        nearby seeds would share samples."""
        if self.seed is None:
            return self
        return self.model_copy(update={"seed": derive_seed(self.seed, *keys)})


def derive_seed(seed: int, *keys: int) -> int:
    digest = hashlib.blake2b(repr((seed, *keys)).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") % (2**31)


class SampleOptions(StrictModel):
    """What a sampling request asks of its prompts: the weights, samples per prompt, the
    sampling options and the logprobs to return."""

    job_id: JobId | None = Field(default=None, description="None: the base model")
    version: VersionRef = "latest"
    n: int = Field(default=1, ge=1, le=256)
    params: SamplingParams = SamplingParams()
    prompt_logprobs: bool = Field(
        default=False,
        description="Also score the prompt: the logprob of each prompt token "
        "given the ones before it (None for the first), under the same weights.",
    )
    top_logprobs: int = Field(
        default=0,
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description="Also give the k most likely "
        "tokens at each sampled position (`Sample.top_logprobs`).",
    )
    prompt_top_logprobs: int = Field(
        default=0,
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description="Also give the k most likely "
        "tokens at each prompt position (`SampleResponse.prompt_top_logprobs`); scores the "
        "prompt as `prompt_logprobs` does.",
    )


class SampleRequest(SampleOptions):
    prompt: str | None = Field(default=None, max_length=MAX_PROMPT_CHARS)
    prompt_token_ids: list[int] | None = Field(default=None, max_length=MAX_PROMPT_TOKENS)

    @model_validator(mode="after")
    def _one_prompt(self) -> Self:
        if (self.prompt is None) == (self.prompt_token_ids is None):
            raise ValueError("give exactly one of prompt or prompt_token_ids")
        if self.prompt_token_ids is not None and not self.prompt_token_ids:
            raise ValueError("prompt_token_ids must not be empty")
        return self


# A prompt of a batch: text, or token ids.
BatchPrompt = (
    Annotated[str, Field(max_length=MAX_PROMPT_CHARS)]
    | Annotated[list[int], Field(min_length=1, max_length=MAX_PROMPT_TOKENS)]
)


class SampleBatchRequest(SampleOptions):
    """Many prompts on one version in one request, so the engine batches them all at once.
    An alias (`latest`) is resolved once for the whole batch. A seed (`params.seed`) gives
    the prompt at index i the seed `params.derived(i)`: no two prompts share their noise, and
    the same request again draws the same samples."""

    prompts: list[BatchPrompt] = Field(min_length=1, max_length=MAX_BATCH_PROMPTS)

    @model_validator(mode="after")
    def _within_the_token_budget(self) -> Self:
        most = batch_prompts_limit(self.n, self.params.max_tokens)
        if len(self.prompts) > most:
            raise ValueError(
                f"a batch may ask to sample at most {MAX_BATCH_SAMPLE_TOKENS:,} tokens "
                f"(prompts x n x params.max_tokens): {len(self.prompts)} x {self.n} x "
                f"{self.params.max_tokens} is more; send at most {most} prompts per request "
                "at these settings (the SDK's sample_many splits them for you)"
            )
        return self


def batch_prompts_limit(n: int, max_tokens: int) -> int:
    """How many prompts one batch request may carry at `n` samples of `max_tokens` each."""
    return max(1, min(MAX_BATCH_PROMPTS, MAX_BATCH_SAMPLE_TOKENS // (n * max_tokens)))


class Sample(LenientModel):
    token_ids: list[int]
    logprobs: list[float]
    text: str
    stop_reason: Literal["stop", "length", "abort"]
    version: int
    top_logprobs: list[RankedLogprobs | None] | None = None  # when asked for


class SampleResponse(LenientModel):
    job_id: str | None
    version: int
    prompt_token_ids: list[int]
    samples: list[Sample]
    prompt_logprobs: list[float | None] | None = None  # when asked for
    prompt_top_logprobs: list[RankedLogprobs | None] | None = None  # when asked for


class SampleBatchResponse(LenientModel):
    """`responses[i]` answers `prompts[i]`; every one was sampled by `version`."""

    job_id: str | None
    version: int
    responses: list[SampleResponse]


class TokenizeRequest(StrictModel):
    texts: list[str] = Field(min_length=1, max_length=4096)
    add_special_tokens: bool = False


class TokenizeResponse(LenientModel):
    token_ids: list[list[int]]


class LoadRequest(StrictModel):
    job_id: JobId
    version: VersionRef = "latest"


class LoadedVersion(LenientModel):
    job_id: str | None
    number: int
    kind: Literal["base", "full", "lora"]


class ResidentVersions(LenientModel):
    base_model: str
    full: LoadedVersion | None
    loras: list[LoadedVersion]


# --- trajectories: POST /v1/rollouts ---------------------------------------------------------


class ChatMessage(StrictModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = Field(max_length=1_000_000)


class RenderRequest(StrictModel):
    """A conversation to turn into training tokens with the model's chat template."""

    messages: list[ChatMessage] = Field(min_length=2, max_length=256)
    tools: list[dict[str, Any]] = Field(
        default=[], max_length=64, description="Tool schemas (OpenAI function format)"
    )


class RenderResponse(LenientModel):
    token_ids: list[int]
    loss_mask: list[int] = Field(description="1 on the assistant's tokens")


class RolloutTask(StrictModel):
    """One prompt of an environment: text (the user's message) or a whole conversation."""

    id: str | None = Field(default=None, max_length=256)
    prompt: str | list[ChatMessage] = Field(description="The user's message, or messages")
    reference: str | None = Field(
        default=None, max_length=1_000_000, description="What the reward compares with"
    )


class RolloutRequest(StrictModel):
    job_id: JobId | None = Field(default=None, description="None: the base model")
    env: str = Field(min_length=1, max_length=64, description="An environment's name")
    env_params: dict[str, Any] = Field(default={}, description="The environment's options")
    tasks: list[RolloutTask] = Field(min_length=1, max_length=4096)
    group_size: int = Field(default=1, ge=1, le=256, description="Trajectories per task")
    params: SamplingParams = Field(
        default=SamplingParams(),
        description="Per model turn; a seed is varied per trajectory and turn",
    )
    version: VersionRef = "latest"
    version_refresh: Literal["group", "turn", "partial"] = Field(
        default="group",
        description="group: an alias is resolved once per group; turn: "
        "before every model turn, so a trajectory continues on a newer version; partial: "
        "also within a turn: a generation a newer version interrupts continues on it (each "
        "part a turn of its own, tagged with its version); needs a job_id",
    )
    max_turns: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Model turns per trajectory (default: the environment's)",
    )
    max_total_tokens: int | None = Field(
        default=None, ge=2, description="Prompt + all turns (default: the model's context)"
    )
    concurrency: int = Field(
        default=64, ge=1, le=1024, description="Trajectories in flight at once"
    )
    schedule: Literal["fifo", "longest_prompt_first"] = Field(
        default="fifo",
        description="Order groups start in; longest_prompt_first starts the "
        "slowest first so short groups fill in and finish early (SortedRL)",
    )
    max_staleness: int | None = Field(
        default=None,
        ge=0,
        description="Cancel a group once its job has published more than "
        "this many versions after the one the group started on (an error event, code "
        "'stale'): a trainer bounding staleness would drop it. Each group on its own: groups "
        "still waiting for a slot start on the newest version. Needs a job_id and refresh "
        "'group' or 'partial'",
    )


class TurnInfo(LenientModel):
    """A span of a trajectory's `token_ids`: a model turn or an environment turn."""

    kind: Literal["model", "env"]
    start: int
    end: int
    text: str
    version: int | None = Field(default=None, description="Model turns: who sampled it")
    stop_reason: Literal["stop", "length", "abort"] | None = None


class TokenTrajectory(LenientModel):
    """A conversation as training tokens: the prompt, then model and environment turns."""

    prompt_token_ids: list[int]
    token_ids: list[int] = Field(description="Everything after the prompt, turns in order")
    logprobs: list[float] = Field(description="Per token of token_ids; 0 for env tokens")
    loss_mask: list[int] = Field(description="1 for model tokens, 0 for env tokens")
    turns: list[TurnInfo]

    @property
    def versions(self) -> list[int]:
        return sorted({t.version for t in self.turns if t.version is not None})


class Trajectory(TokenTrajectory):
    task_index: int
    sample_index: int
    stop_reason: Literal["done", "max_turns", "max_tokens", "length", "abort"]
    response: str = Field(description="What the reward scored")
    reward: float | None = None
    reward_error: str | None = None
    reward_detail: dict[str, Any] = {}
    timings: dict[str, float] = {}


class RolloutGroup(LenientModel):
    task_index: int
    task_id: str | None = None
    trajectories: list[Trajectory]

    @property
    def rewards(self) -> list[float | None]:
        return [t.reward for t in self.trajectories]


class RolloutSummary(LenientModel):
    groups: int
    trajectories: int
    model_tokens: int
    env_tokens: int
    wall_s: float


STALE_GROUP = "stale"  # the error code of a group cancelled by `max_staleness`


class RolloutEvent(LenientModel):
    """One NDJSON line of the stream: a finished group, an error, or the closing summary."""

    type: Literal["group", "error", "summary"]
    group: RolloutGroup | None = None
    error: ErrorBody | None = None
    summary: RolloutSummary | None = None


# --- captured trajectories: OpenAI calls recorded for training ---------------------------------


class TrajectoryCreate(StrictModel):
    job_id: JobId | None = Field(default=None, description="None: the base model")
    version: VersionRef = Field(
        default="latest",
        description="Which version answers every call; an alias is resolved at each call",
    )
    metadata: dict[str, Any] = Field(
        default={},
        description="Kept with the trajectory (task, episode, anything the script needs back)",
    )


class TrajectoryInfo(LenientModel):
    id: str
    job_id: str | None
    version: VersionRef
    metadata: dict[str, Any]
    created_at: datetime
    calls: int = Field(description="Completions recorded so far")


class CapturedCall(LenientModel):
    """One recorded completion (a call with n choices records n)."""

    index: int
    parent: int | None = Field(description="The earlier call this one's prompt extends")
    endpoint: Literal["chat", "completions"]
    version: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str


class CapturedSegment(TokenTrajectory):
    """A chain of calls, each extending the last: one sequence to train on, the model's
    tokens exactly as sampled and everything the agent added in between as context."""

    calls: list[int]


class CapturedTrajectory(LenientModel):
    trajectory: TrajectoryInfo
    calls: list[CapturedCall]
    segments: list[CapturedSegment] = Field(
        description="One per branch: calls that do not extend each other start a new one"
    )


# --- replicas: each rollout replica announces itself to the gateway --------------------------


class ReplicaHeartbeat(StrictModel):
    """What a rollout replica tells the gateway at every heartbeat
    (`PUT /v1/internal/replicas/{replica_id}`, service token): the gateway routes by it."""

    url: str = Field(
        min_length=8,
        max_length=2048,
        pattern=r"^https?://",
        description="Where the gateway reaches the replica",
    )
    ready: bool = Field(description="Its engine is started and warmed up")
    versions: list[LoadedVersion] = Field(
        default=[], max_length=4096, description="Versions resident in its engine"
    )
    requests_in_flight: int = Field(default=0, ge=0)
    tokens_in_flight: int = Field(
        default=0, ge=0, description="Prompt tokens plus token budgets of those requests"
    )
    heartbeat_s: float = Field(
        gt=0,
        le=3600,
        description="Its interval: a replica silent for a few intervals leaves the routing table",
    )


class ReplicaPublic(LenientModel):
    """A rollout replica as the gateway routes to it."""

    id: str
    url: str
    static: bool = Field(
        description="The configured LOOM_ROLLOUT_URL, serving while no replica has registered"
    )
    ready: bool
    set_aside: bool = Field(
        description="A connection failed since its last heartbeat: no "
        "request goes to it until the next one"
    )
    versions: list[LoadedVersion]
    requests_in_flight: int = Field(description="As the replica last reported")
    tokens_in_flight: int
    gateway_in_flight: int = Field(description="This gateway's requests open on it")
    routed: int = Field(description="Requests this gateway sent it")
    failures: int = Field(description="Connections that failed")
    heartbeat_s: float
    last_heartbeat_s_ago: float | None


class ReplicaList(LenientModel):
    replicas: list[ReplicaPublic]


class FetchClaim(StrictModel):
    """A replica about to fetch a version's files tells the gateway
    (`POST /v1/internal/replicas/{replica_id}/fetches`, service token), which answers where
    to fetch them from: replicas that publish reaches at the same moment form a chain instead
    of each going to the store."""

    job_id: JobId
    number: VersionNumber


class FetchSources(LenientModel):
    """Replica URLs to fetch a version's files from, best first: the replica that claimed the
    version just before (its file may still be arriving, served as it grows), then earlier
    claimants, then replicas holding it; the store comes after them all."""

    sources: list[str]
