"""OpenAI-compatible endpoints: existing agent code pointed at Loom gets token ids and logprobs
captured. The `model` field picks the version that answers."""
