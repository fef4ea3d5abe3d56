"""Trajectory capture: OpenAI calls made inside a trajectory are recorded token by token, so a
black-box agent written against the OpenAI API can be trained."""

from services.rollout.capture.capture import Capture, Recording
from services.rollout.capture.store import NewCall, TrajectoryStore

__all__ = ["Capture", "NewCall", "Recording", "TrajectoryStore"]
