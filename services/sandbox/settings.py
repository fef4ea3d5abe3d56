"""Sandbox service settings (`LOOM_SANDBOX_*`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from services.common.settings import LoomSettings


class SandboxSettings(LoomSettings):
    sandbox_backend: Literal["auto", "docker", "process"] = Field(
        default="auto",
        description="How code is isolated: `docker` (containers from a warm pool), `process` "
        "(rlimits, namespaces, a uid per slot), or `auto`: docker when a daemon answers and "
        "the sandbox image exists, else process.",
    )
    sandbox_max_concurrency: int = Field(
        default=4, ge=1, le=256, description="Executions running at once (agents: processes or "
        "containers); the rest wait."
    )
    sandbox_max_uses: int = Field(
        default=200, ge=1, description="Programs an agent runs before it is replaced."
    )
    sandbox_python: str | None = Field(
        default=None,
        description="Interpreter for sandboxed code. Default: the service's own Python if the "
        "sandbox user can run it, else the first of /usr/local/bin/python3, /usr/bin/python3.",
    )
    sandbox_user_id_base: int | None = Field(
        default=61000,
        ge=1000,
        description="When the service runs as root, execution slot i runs as uid/gid base+i "
        "(no passwd entry needed), so sandboxes cannot read the service's files or signal "
        "each other. None: run as the service's user.",
    )
    sandbox_max_processes: int = Field(
        default=64, ge=1, description="RLIMIT_NPROC per sandbox (only enforced with a slot uid)."
    )
    sandbox_max_file_mb: int = Field(default=64, ge=1, description="RLIMIT_FSIZE per file.")
    sandbox_max_open_files: int = Field(default=256, ge=16, description="RLIMIT_NOFILE.")
    sandbox_output_overflow_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=0,
        description="Output drained (and dropped) past max_output_bytes before the program is "
        "killed as a flood.",
    )
    sandbox_docker_url: str = Field(
        default="unix:///var/run/docker.sock", description="The Docker daemon (docker backend)."
    )
    sandbox_docker_image: str = Field(
        default="loom-sandbox:latest",
        description="Image the docker backend runs programs in (built from docker/sandbox).",
    )
    sandbox_docker_images: list[str] = Field(
        default=[], description="More images requests may pick (`image`), each with a warm "
        "pool of its own; any image with python3 (and the sandbox uid's home) works.",
    )
    sandbox_docker_pool: str | None = Field(
        default=None,
        description="Label of this service's containers; containers left with it by an "
        "earlier run are removed at start. Default: loom-sandbox-<port>.",
    )
    sandbox_docker_user_id: int = Field(
        default=65432, ge=1, description="The unprivileged uid programs run as in containers."
    )
    sandbox_docker_memory_mb: int = Field(
        default=1024, ge=64, description="Memory limit of each container (programs + agent)."
    )
    sandbox_docker_cpus: float = Field(default=1.0, gt=0, description="CPUs per container.")

    sandbox_max_sessions: int = Field(
        default=16, ge=0, le=1024, description="Open sessions at once (each holds an agent)."
    )
    sandbox_max_sessions_per_job: int = Field(
        default=4, ge=1, description="Open sessions one job may hold."
    )
    sandbox_session_idle_s: float = Field(
        default=300.0, gt=0, description="A session unused this long is closed."
    )
    sandbox_max_collect_bytes: int = Field(
        default=16 * 1024 * 1024, ge=0,
        description="Total size of the files one execution may return (`collect`).",
    )
    sandbox_tmp_mb: int = Field(
        default=64, ge=1, description="Size of each sandbox's private /tmp (and, in containers, "
        "of /work).",
    )
