"""The stack's health as the gateway sees it: probing (`health`) and `GET /v1/health`."""
