"""Training black-box agents: an agent written against the OpenAI API is pointed at a
capture session, and every call it makes is recorded token by token.

    capture = await job.capture(metadata={"task": 7})
    agent = openai.AsyncOpenAI(base_url=capture.openai_base_url, api_key=capture.api_key)
    ...                                   # the agent runs, tool calls and all
    captured = await capture.fetch()      # calls and training segments
    datum = trajectory_datum(captured.segments[0], advantage)
    await capture.delete()
"""

from __future__ import annotations

from agents.sdk._http import GatewayHttp
from services.rollout.client import GET_TRAJECTORY
from services.rollout.schemas import CapturedTrajectory, TrajectoryCreate, TrajectoryInfo


class AsyncCaptureSession:
    api_key: str  # what the agent's OpenAI client sends
    info: TrajectoryInfo

    def __init__(self, http: GatewayHttp, api_key: str, info: TrajectoryInfo) -> None:
        self._http = http
        self.api_key = api_key
        self.info = info

    @classmethod
    async def create(
        cls, http: GatewayHttp, api_key: str, request: TrajectoryCreate
    ) -> AsyncCaptureSession:
        return cls(http, api_key, await http.rollout.create_trajectory(request))

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def openai_base_url(self) -> str:
        """What an OpenAI client's `base_url` is set to: it appends `/chat/completions`."""
        rollout = self._http.rollout
        return f"{rollout.http.base_url}{rollout.path(GET_TRAJECTORY.url(trajectory_id=self.id))}"

    async def fetch(self) -> CapturedTrajectory:
        captured = await self._http.rollout.get_trajectory(self.id)
        self.info = captured.trajectory
        return captured

    async def delete(self) -> None:
        await self._http.rollout.delete_trajectory(self.id)

    def __repr__(self) -> str:
        return f"AsyncCaptureSession({self.id!r}, job_id={self.info.job_id!r})"
