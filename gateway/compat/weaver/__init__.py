"""Nex-AGI's Weaver SDK protocol (`nex-weaver`), served by the gateway under `/weaver`."""
