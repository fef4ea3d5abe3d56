"""Gateway settings (`LOOM_GATEWAY_*`), on top of the shared `LoomSettings`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator

from gateway.schemas import parse_trackers
from gateway.trackers.writers import TrackerOptions
from services.common.settings import LoomSettings

# The services the gateway fronts, in the order a reader expects them.
UPSTREAMS = ("rollout", "reward", "sandbox", "trainer", "modelstate")


class GatewaySettings(LoomSettings):
    gateway_admin_key: SecretStr | None = Field(
        default=None,
        min_length=20,
        description="Bootstrap admin key, set explicitly (compose, production). Unset: a random "
        "key is created at first start, printed once and written to <data_dir>/admin_key.",
    )
    gateway_write_admin_key_file: bool = Field(
        default=True,
        description="Write a generated bootstrap key to <data_dir>/admin_key (mode 0600) so the "
        "local CLI finds it. Turn off, or delete the file, in production.",
    )
    gateway_auth_cache_s: float = Field(
        default=10.0,
        ge=0,
        description="How long a validated key is trusted without asking the database again "
        "(a revocation through another gateway replica takes up to this long). 0: no cache.",
    )
    gateway_proxy_connect_timeout_s: float = Field(default=5.0, gt=0)
    gateway_proxy_timeout_s: float = Field(
        default=900.0,
        gt=0,
        description="Longest silence from an upstream (read/write) before the proxy gives up; "
        "long because sampling and streams can be slow.",
    )
    gateway_health_timeout_s: float = Field(default=2.0, gt=0)
    gateway_replica_missed_heartbeats: float = Field(
        default=3.0,
        ge=1,
        description="A rollout replica silent for this many of its heartbeat intervals leaves "
        "the routing table (its next heartbeat adds it back).",
    )
    gateway_max_body_mb: int = Field(
        default=64,
        ge=1,
        description="Largest request body a job key may send through the proxy (413 beyond): "
        "training data is its biggest call.",
    )
    gateway_admin_max_body_mb: int = Field(
        default=32768,
        ge=1,
        description="Largest request body an admin key may send through the proxy (weights "
        "and blobs go up this way).",
    )
    gateway_admin_session_secret: SecretStr | None = Field(
        default=None,
        min_length=32,
        description="Key that signs web admin (/admin) session cookies and CSRF tokens. Unset: "
        "a random one per gateway start, so restarting logs everyone out; set the same value "
        "on every replica behind one load balancer.",
    )
    gateway_admin_session_ttl_s: float = Field(
        default=12 * 3600,
        gt=0,
        description="How long a web admin login lasts before the key must be entered again.",
    )
    gateway_samples_kept_per_job: int = Field(
        default=1_000,
        ge=1,
        le=1_000_000,
        description="Logged samples a job keeps for inspection; older ones are dropped.",
    )
    gateway_sdk_base_models: dict[str, str] = Field(
        default={},
        description="Base model names of Tinker and Weaver SDK scripts -> Loom base models "
        '(JSON), since nothing is fetched from a hub: e.g. {"Qwen/Qwen3-8B": '
        '"/models/qwen3-8b"}. Unlisted names are used as given.',
    )

    trackers: str = Field(
        default="",
        description="Experiment trackers every job's metrics are mirrored to, comma-separated: "
        "wandb, mlflow, tensorboard (the trackers extra installs them). A job's config "
        '{"trackers": [...]} chooses its own. A failing tracker never fails the job.',
    )
    trackers_samples: str = Field(
        default="",
        description="Of those, the trackers that also get the samples a job logs, as tables "
        "(a W&B Table, an MLflow JSON artifact, TensorBoard text), comma-separated; none by "
        "default (samples hold prompts and completions, which may be private).",
    )
    trackers_dir: Path | None = Field(
        default=None,
        description="Where W&B offline runs and TensorBoard event files go (and the MLflow "
        "store, unless LOOM_TRACKERS_MLFLOW_URI). Unset: <data_dir>/trackers.",
    )
    trackers_mlflow_uri: str | None = Field(
        default=None,
        description="MLflow tracking URI (a server or a database). Unset: a SQLite store in "
        "LOOM_TRACKERS_DIR.",
    )
    trackers_mlflow_experiment: str = Field(default="loom", min_length=1)
    trackers_wandb_project: str = Field(default="loom", min_length=1)
    trackers_wandb_mode: Literal["offline", "online", "disabled"] = Field(
        default="offline", description="online needs WANDB_API_KEY and a reachable W&B."
    )
    trackers_retries: int = Field(
        default=3,
        ge=0,
        le=20,
        description="Retries (with doubling backoff from 1 s) of a failed tracker delivery "
        "before its points are dropped and counted in /metrics.",
    )

    @field_validator("trackers", "trackers_samples")
    @classmethod
    def _known_trackers(cls, value: str) -> str:
        parse_trackers(value)
        return value

    @property
    def admin_key_file(self) -> Path:
        return self.data_dir / "admin_key"

    def tracker_options(self) -> TrackerOptions:
        root = self.trackers_dir or self.data_dir / "trackers"
        return TrackerOptions(
            root=root,
            wandb_project=self.trackers_wandb_project,
            wandb_mode=self.trackers_wandb_mode,
            mlflow_uri=self.trackers_mlflow_uri or f"sqlite:///{root / 'mlflow.db'}",
            mlflow_experiment=self.trackers_mlflow_experiment,
            mlflow_artifacts=None
            if self.trackers_mlflow_uri
            else (root / "mlflow-artifacts").resolve().as_uri(),
            samples=parse_trackers(self.trackers_samples),
        )
