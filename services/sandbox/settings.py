"""Sandbox service settings (`LOOM_SANDBOX_*`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from services.common.settings import LoomSettings


class SandboxSettings(LoomSettings):
    sandbox_backend: Literal["auto", "docker", "process"] = Field(
        default="auto",
        description="How code is isolated: `docker` (containers from a warm pool), `process` "
        "(a bubblewrap sandbox and a control group per slot, a uid per slot: no daemon), or "
        "`auto`: docker when a daemon answers and the sandbox image exists, else process.",
    )
    sandbox_max_concurrency: int = Field(
        default=4,
        ge=1,
        le=256,
        description="Executions running at once (agents: processes or containers); the rest wait.",
    )
    sandbox_max_uses: int = Field(
        default=200, ge=1, description="Programs an agent runs before it is replaced."
    )
    sandbox_python: str | None = Field(
        default=None,
        description="Interpreter for sandboxed code. Default: the service's own Python (its "
        "real path: a virtual environment's packages are not in the process sandbox) if the "
        "sandbox user can run it, else the first of /usr/local/bin/python3, /usr/bin/python3.",
    )
    sandbox_user_id_base: int | None = Field(
        default=61000,
        ge=1000,
        description="When the service runs as root, execution slot i runs as uid/gid start+i "
        "(no passwd entry needed), so sandboxes cannot read the service's files or signal "
        "each other; process backend: each service on a host claims its own range of 2048 "
        "uids from this base (start = base + k*2048), locked under "
        "LOOM_SANDBOX_LOCK_DIR. None: run as the service's user.",
    )
    sandbox_lock_dir: str = Field(
        default="/run/loom-sandbox",
        description="Process backend: where services on one host lock their uid ranges (the "
        "same directory for all of them).",
    )
    sandbox_bwrap: str = Field(
        default="bwrap",
        description="Process backend: the bubblewrap executable (Debian/Ubuntu package "
        "`bubblewrap`); without it the service does not start.",
    )
    sandbox_process_memory_mb: int = Field(
        default=2048,
        ge=64,
        description="Process backend: the most `memory_mb` a request may ask for (more is a "
        "422); the slot's control group holds the program and all its children to their "
        "`memory_mb`, tmpfs files included.",
    )
    sandbox_process_cpus: float = Field(
        default=1.0,
        gt=0,
        description="Process backend: CPUs each slot's control group may use (a quota), so "
        "busy or forking programs cannot starve the service.",
    )
    sandbox_max_processes: int = Field(
        default=64,
        ge=1,
        description="Processes per sandbox: RLIMIT_NPROC with a slot uid; "
        "the process backend's control group also holds the whole sandbox to it.",
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
        default=[],
        description="More images requests may pick (`image`), each with a warm "
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
        default=16 * 1024 * 1024,
        ge=0,
        description="Total size of the files one execution may return (`collect`).",
    )
    sandbox_tmp_mb: int = Field(
        default=64,
        ge=1,
        description="Size of each of a sandbox's tmpfs (/work, where "
        "collected and session files live, and /tmp; /dev/shm too in the process backend).",
    )
