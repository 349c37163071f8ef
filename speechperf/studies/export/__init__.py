"""export stage: a run folder's curves, configuration and TTA into TensorBoard and MLflow (docs/export.md)."""
