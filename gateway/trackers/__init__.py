"""Experiment trackers (W&B, MLflow, TensorBoard) that mirror what jobs log: `mirror` decides
what goes where and when, `writers` speak each tracker's own client library."""
