"""The proxy to Loom's services: `/v1/{service}/*` forwarded with job scoping and body caps,
rollout routed over its registered replicas."""
