"""Analyses of finished runs: TTA, aggregates over seeds, reference convergence points, curves,
the time's parts, the sweep's speedups, evaluations of a run's weights, the report and exports."""
