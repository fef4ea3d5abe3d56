"""The SDK's HTTP core: the services' own client, with the gateway's key and errors raised
as they are (a 5xx from the gateway is the gateway's fault, not an upstream's); each service's
typed client through the gateway (`/v1/<service>/...`) shares its connections and key."""

from __future__ import annotations

import httpx2

from modelstate.client import ModelStateClient
from services.common.http import ServiceClient, envelope_error
from services.reward.client import RewardClient
from services.rollout.client import RolloutClient
from services.sandbox.client import SandboxClient
from services.trainer.client import TrainerClient


class GatewayHttp(ServiceClient):
    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        transport: httpx2.AsyncBaseTransport | None = None,
        timeout: float = 300.0,
    ) -> None:
        super().__init__(
            url,
            service="gateway",
            transport=transport,
            timeout=httpx2.Timeout(timeout, connect=10.0),
            headers={"Authorization": f"Bearer {api_key}"},
        )
        self.trainer = TrainerClient(self.http, through_gateway=True)
        self.rollout = RolloutClient(self.http, through_gateway=True)
        self.reward = RewardClient(self.http, through_gateway=True)
        self.sandbox = SandboxClient(self.http, through_gateway=True)
        self.modelstate = ModelStateClient(self.http, through_gateway=True)

    def raise_for_status(self, response: httpx2.Response) -> None:
        if response.status_code >= 400:
            raise envelope_error(response)
