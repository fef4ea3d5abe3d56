"""The Tinker SDK's wire protocol, served by the gateway and mapped onto Loom's own trainer,
rollout and jobs (no second implementation of training or sampling)."""
