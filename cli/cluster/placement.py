"""The stack on an existing Ray cluster: every service a named, detached Ray actor
(`cli.cluster.actors.ServiceProcess`) in the `loom` namespace, placed by its resource
request, still an HTTP service. Rollout replicas are actors `rollout-0..N-1`: each announces
itself to the gateway, so scaling is adding or removing actors, and Ray restarts a replica
whose node died on another node (it comes back with a new URL and registers again).

Where each service may run: a rollout replica anywhere (SPREAD over the nodes; one that dies
with its node comes back elsewhere by itself); the trainer's ranks where its placement group
(`cli.cluster.trainer_group`) fits them; every other service on the head node. The others keep
the URL they started with, so they must not sit on a node that may go; the head is the node the
cluster cannot lose anyway (Ray's own control store lives there). The trainer holds its jobs'
models in memory: its node lost is a restart by hand (managed runs then resume from their last
checkpoint).

State stays outside Ray: the database (`--database-url`: PostgreSQL for more than one host),
the store's blobs and the data dir (a shared directory or an object store), Redis for Celery.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import httpx2

from cli.cluster import trainer_group
from cli.cluster.actors import ServiceProcess
from cli.cluster.trainer_group import TrainerRanks
from services.common.service_token import service_token, token_environment
from services.common.settings import LoomSettings

NAMESPACE = "loom"
ROLLOUT = "rollout"
# (actor name, module); in start order: the public entry and the worker last.
BASE = (
    ("modelstate", "modelstate"),
    ("trainer", "services.trainer"),
    ("reward", "services.reward"),
    ("sandbox", "services.sandbox"),
    ("gateway", "gateway"),
)
WORKER = ("worker", "services.worker")
READY_TIMEOUT_S = 900.0
LIVENESS_EVERY_S = 5.0
TASK_RETRIES = 3
# Ray's marker resource of the head node (Ray Train pins its detached state actor the same way).
ON_HEAD = {"node:__internal_head__": 0.001}
# A replica that does not answer its drain within this long is gone (its node died and Ray
# waits for room to restart it): it is removed without one.
DRAIN_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 90.0  # the service's own grace (ServiceProcess.stop) and some


@dataclass(frozen=True)
class ClusterSpec:
    """What `loom cluster up` asks of Ray. `rollout_resources`: per replica, e.g. CPU 1 on CPU
    nodes, GPU (tensor x data parallel size) on GPU nodes."""

    settings: LoomSettings  # data dir, database URL, service token
    rollout_cpus: float = 1.0
    rollout_gpus: float = 0.0
    trainer: TrainerRanks = TrainerRanks()  # its ranks and each one's CPUs and GPUs
    # Custom Ray resources each replica needs, e.g. {"rollout_slot": 1} with nodes started
    # `--resources '{"rollout_slot": 1}'`: at most one replica per node.
    rollout_resources: dict[str, float] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # more LOOM_* for every service

    def stack_env(self) -> dict[str, str]:
        env = {
            "LOOM_DATA_DIR": str(self.settings.data_dir),
            **token_environment(self.settings),
            **self.env,
        }
        if self.settings.database_url:
            env["LOOM_DATABASE_URL"] = self.settings.database_url
        return env

    def replica_env(self) -> dict[str, str]:
        """What each rollout replica adds on CPU nodes: a core slot the size of its CPU request,
        so replicas that share a host bind different cores (`services.rollout.cpu_cores`).
        `env` may say otherwise."""
        if self.rollout_gpus or self.rollout_cpus < 1:
            return {}
        return {"LOOM_ROLLOUT_CPU_CORES_PER_REPLICA": str(int(self.rollout_cpus))}

    @property
    def log_dir(self) -> str:
        return str(self.settings.data_dir / "run" / "cluster")


def connect(address: str) -> None:
    import ray

    ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)


def _actor_class() -> Any:
    import ray

    return ray.remote(ServiceProcess)


def _options(
    name: str, cpus: float, gpus: float, *, restarts: int, spread: bool = False
) -> dict[str, Any]:
    """Named and detached (they outlive the command that started them); `spread`: on as many
    nodes as possible (rollout replicas: a node lost takes as few as it can)."""
    options: dict[str, Any] = {
        "name": name,
        "namespace": NAMESPACE,
        "lifetime": "detached",
        "num_cpus": cpus,
        "num_gpus": gpus,
        "max_restarts": restarts,
        "get_if_exists": True,
        # Every method is idempotent: a call that met the actor restarting, or unreachable for
        # a moment on a busy node (ActorUnavailableError), is sent again.
        "max_task_retries": TASK_RETRIES,
    }
    if spread:
        options["scheduling_strategy"] = "SPREAD"
    return options


def up(spec: ClusterSpec, replicas: int) -> dict[str, str]:
    """Start the services and `replicas` rollout replicas; their URLs by name, once ready."""
    import ray

    spec.settings.ensure_data_dir()
    service_token(spec.settings)  # created once, before the actors race for it
    ranks = trainer_group.reserve(spec.trainer, READY_TIMEOUT_S)
    actor = _actor_class()
    env = spec.stack_env()
    actors = {
        name: actor.options(
            **(
                {
                    **_options(name, spec.trainer.cpus, spec.trainer.gpus, restarts=0),
                    **trainer_group.in_bundle(ranks, 0),
                }
                if name == "trainer"
                else {**_options(name, 0, 0, restarts=0), "resources": ON_HEAD}
            )
        ).remote(name, module, env, spec.log_dir)
        for name, module in (*BASE, WORKER)
    }
    urls = {
        name: info["url"]
        for name, info in zip(
            actors, ray.get([a.where.remote() for a in actors.values()]), strict=True
        )
    }
    stack_env = {**env, **_urls_env(urls)}
    trainer_env = spec.trainer.env(
        ray.get(actors["trainer"].gpu_ids.remote())
        + trainer_group.hold_slots(ranks, spec.trainer, NAMESPACE)
    )
    ray.get(
        [
            a.start.remote({**stack_env, **(trainer_env if name == "trainer" else {})})
            for name, a in actors.items()
            if name != WORKER[0]
        ]
    )
    # The worker waits for rollout before a run: it asks the gateway, which knows the replicas.
    ray.get(
        actors[WORKER[0]].start.remote(
            {**stack_env, "LOOM_ROLLOUT_URL": f"{urls['gateway']}/v1/internal/rollout"}
        )
    )
    _wait_ready(
        actors, {name: url for name, url in urls.items() if name != WORKER[0]}, spec.log_dir
    )
    return {**urls, **scale(spec, replicas)}


def scale(spec: ClusterSpec, replicas: int) -> dict[str, str]:
    """Add or remove rollout replicas until there are `replicas`; the new ones' URLs, once
    ready. A replica removed drains first (it leaves the gateway's table, then its running
    requests finish), so scaling down loses no request."""
    import ray

    env = {**spec.replica_env(), **_stack_env(spec)}
    names = rollout_names()
    wanted = [f"{ROLLOUT}-{index}" for index in range(replicas)]
    actor = _actor_class()
    added = {
        name: actor.options(
            **_options(name, spec.rollout_cpus, spec.rollout_gpus, restarts=-1, spread=True),
            resources=spec.rollout_resources,
        ).remote(name, "services.rollout", env, spec.log_dir, True)
        for name in wanted
        if name not in names
    }
    token = service_token(spec.settings)
    for name in sorted(set(names) - set(wanted), reverse=True):
        handle = ray.get_actor(name, namespace=NAMESPACE)
        if _answered(handle.drain.remote(token), DRAIN_TIMEOUT_S):
            _answered(handle.stop.remote(), STOP_TIMEOUT_S)
        ray.kill(handle)  # one that did not answer: this ends Ray's attempts to restart it
    urls = {
        name: info["url"]
        for name, info in zip(
            added, ray.get([a.where.remote() for a in added.values()]), strict=True
        )
    }
    _wait_ready(added, urls, spec.log_dir)
    return urls


def rollout_names() -> list[str]:
    import ray

    return sorted(
        (
            a["name"]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == NAMESPACE and a["name"].startswith(f"{ROLLOUT}-")
        ),
        key=lambda name: int(name.rsplit("-", 1)[1]),
    )


def status() -> list[dict[str, Any]]:
    """Each Loom actor: name, URL, node, whether its process runs."""
    import ray

    names = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == NAMESPACE
    ]
    handles = [ray.get_actor(name, namespace=NAMESPACE) for name in names]
    where = ray.get([h.where.remote() for h in handles])
    alive = ray.get([h.alive.remote() for h in handles])
    return [{**w, "alive": a} for w, a in zip(where, alive, strict=True)]


def down(spec: ClusterSpec) -> None:
    """Stop every Loom actor: the replicas (drained), then the other services at once."""
    import ray

    scale(spec, 0)
    handles = []
    for name in (WORKER[0], *(name for name, _ in BASE)):
        with contextlib.suppress(ValueError):  # not running
            handles.append(ray.get_actor(name, namespace=NAMESPACE))
    ray.get([handle.stop.remote() for handle in handles])  # side by side
    for handle in handles:
        ray.kill(handle)
    trainer_group.release(NAMESPACE)


def _answered(call: Any, timeout_s: float) -> bool:
    """Whether an actor call returned within `timeout_s`. A call to an actor whose node died
    fails, or waits for a restart that may never come (no room left): neither answers."""
    import ray

    done, _ = ray.wait([call], timeout=timeout_s)
    if not done:
        return False
    try:
        ray.get(done[0])
    except ray.exceptions.RayError:
        return False
    return True


def _wait_ready(
    actors: dict[str, Any], urls: dict[str, str], log_dir: str, timeout_s: float = READY_TIMEOUT_S
) -> None:
    """Until every service answers `/readyz`; a service whose process exited fails at once,
    naming its log (a vLLM start-up takes minutes: nobody should wait them out for a crash)."""
    import ray

    deadline = time.monotonic() + timeout_s
    waiting = dict(urls)
    next_liveness = time.monotonic() + LIVENESS_EVERY_S
    while waiting:
        for name, url in list(waiting.items()):
            try:
                if httpx2.get(f"{url}/readyz", timeout=2).status_code == 200:
                    del waiting[name]
            except httpx2.TransportError:
                pass
        if waiting and time.monotonic() > next_liveness:
            next_liveness = time.monotonic() + LIVENESS_EVERY_S
            alive = ray.get([actors[name].alive.remote() for name in waiting])
            dead = [name for name, up in zip(waiting, alive, strict=True) if not up]
            if dead:
                raise RuntimeError(
                    f"exited while starting: {', '.join(dead)} (see "
                    + ", ".join(f"{log_dir}/{name}.log" for name in dead)
                    + ")"
                )
        if waiting and time.monotonic() > deadline:
            raise TimeoutError(f"not ready after {timeout_s:.0f} s: {', '.join(waiting)}")
        time.sleep(0.5)


def _urls_env(urls: dict[str, str]) -> dict[str, str]:
    """LOOM_<SERVICE>_URL of each HTTP service. Rollout has none: its replicas register with
    the gateway (the gateway's LOOM_ROLLOUT_URL stays its default, where nothing listens)."""
    return {f"LOOM_{name.upper()}_URL": url for name, url in urls.items() if name != WORKER[0]}


def _stack_env(spec: ClusterSpec) -> dict[str, str]:
    """The environment the running stack's services share, with their URLs asked of Ray."""
    import ray

    handles = [ray.get_actor(name, namespace=NAMESPACE) for name, _ in BASE]
    where = ray.get([h.where.remote() for h in handles])
    return {**spec.stack_env(), **_urls_env({w["name"]: w["url"] for w in where})}
