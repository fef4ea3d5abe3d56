"""The SDK protocols the gateway serves besides Loom's own: Tinker's and Weaver's REST APIs
(`tinker`, `weaver`), over what they share (`common`)."""
