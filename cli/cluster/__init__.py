"""Loom on a Ray cluster: the services as Ray actors (`loom cluster up/scale/status/down`)."""
