"""Rollout: a real vLLM engine serving the base model and published versions, with sampling,
logprobs, weight hand-off from modelstate and OpenAI-compatible endpoints."""
