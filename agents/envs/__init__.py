"""Loom's built-in environments for agentic rollouts: `arithmetic`, `countdown` and
`python_tool`. They implement `services.rollout.environments.Environment` and are registered
under the `loom.environments` entry-point group in pyproject.toml, as a third-party
environment would be; the rollout service finds them there."""
