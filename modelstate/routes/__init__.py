"""HTTP routes of the model-state store: parse, call the store, return."""

from modelstate.routes import blobs, housekeeping, versions

routers = [blobs.router, versions.router, housekeeping.router]
