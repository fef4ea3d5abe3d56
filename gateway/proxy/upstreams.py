"""The services behind the gateway: one pooled HTTP client each, and the stack's health."""

from __future__ import annotations

import asyncio

import httpx2

from gateway.proxy.replicas import Replica, ReplicaRegistry
from gateway.schemas import StackHealth
from gateway.settings import UPSTREAMS, GatewaySettings
from services.common.errors import NotFound
from services.common.http import CLIENT_KEEP_ALIVE_S
from services.common.http_pool import pooled_transport
from services.common.schemas import Health
from services.common.service_token import service_headers


class Upstreams:
    """One pooled client per service, built once in the lifespan."""

    def __init__(
        self, settings: GatewaySettings, transport: httpx2.AsyncBaseTransport | None = None
    ) -> None:
        timeout = httpx2.Timeout(
            settings.gateway_proxy_timeout_s, connect=settings.gateway_proxy_connect_timeout_s
        )
        # Every connection may stay pooled while idle: a burst (64 samples sent at once) then
        # finds its connections open again on the next burst instead of reconnecting.
        limits = httpx2.Limits(
            max_connections=200, max_keepalive_connections=200, keepalive_expiry=CLIENT_KEEP_ALIVE_S
        )
        self.health_timeout = settings.gateway_health_timeout_s
        # Every request the gateway sends a service (proxied, admin pages, health) carries the
        # service token; the proxy drops any copy a client sent, so this one is the only one.
        headers = service_headers(settings)

        def make_client(url: str) -> httpx2.AsyncClient:
            return httpx2.AsyncClient(
                base_url=url,
                timeout=timeout,
                headers=headers,
                transport=transport or pooled_transport(limits),
            )

        self.clients = {name: make_client(settings.url_of(name)) for name in UPSTREAMS}
        # Rollout calls go to its replicas; the configured URL is the static one.
        self.replicas = ReplicaRegistry(
            settings.url_of("rollout"),
            make_client,
            missed_heartbeats=settings.gateway_replica_missed_heartbeats,
        )

    def client(self, service: str) -> httpx2.AsyncClient:
        client = self.clients.get(service)
        if client is None:
            raise NotFound(
                f"Unknown service {service!r}: the gateway proxies /v1/<service>/... for "
                f"{', '.join(self.clients)} (and serves /v1/jobs, /v1/keys, /v1/health itself).",
                {"known_services": list(self.clients)},
            )
        return client

    async def health(self, *known: Health) -> StackHealth:
        """Every service's readiness, asked concurrently (one slow service costs at most the
        health timeout), with `known`: what the gateway answers itself (its own, workers')."""
        probes = await asyncio.gather(*(self.probe(name) for name in self.clients))
        services = {**{h.service: h for h in known}, **dict(zip(self.clients, probes, strict=True))}
        healthy = all(health.status in ("ready", "ok") for health in services.values())
        return StackHealth(status="ok" if healthy else "degraded", services=services)

    async def probe(self, service: str) -> Health:
        if service == "rollout" and (registered := self.replicas.live()):
            return replicas_health(registered)
        client = self.clients[service]
        try:
            response = await client.get("/readyz", timeout=self.health_timeout)
        except httpx2.TransportError as exc:
            return Health(
                service=service,
                status="unreachable",
                version="unknown",
                detail={"url": str(client.base_url), "error": repr(exc)},
            )
        try:
            return Health.model_validate(response.json())
        except ValueError:
            return Health(
                service=service,
                status="error",
                version="unknown",
                detail={"http_status": response.status_code, "body": response.text[:500]},
            )

    async def aclose(self) -> None:
        for client in self.clients.values():
            await client.aclose()
        await self.replicas.aclose()


def replicas_health(registered: list[Replica]) -> Health:
    """Rollout's health once replicas have registered: ready while one of them is (their
    heartbeats are the probes)."""
    ready = [r.id for r in registered if r.ready and not r.set_aside]
    return Health(
        service="rollout",
        status="ready" if ready else "starting",
        version="unknown",
        detail={"replicas": len(registered), "ready": ready},
    )
