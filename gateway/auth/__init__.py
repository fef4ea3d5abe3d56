"""Who may call the gateway: API keys, the middleware that checks them, the bootstrap admin
key, and what a job key may reach through the proxy (scopes)."""
