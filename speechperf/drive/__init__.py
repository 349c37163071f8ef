"""What starts processes and trainings: the demo, the seeds of one command (in turn or side by
side), the parallel sweep and ``reproduce``."""
