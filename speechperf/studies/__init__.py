"""studies and commands: seeds, reproduction, the sweep, the metric studies over run folders, the report."""
