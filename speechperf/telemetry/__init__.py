"""The readers that sample the machine while a run or a benchmark works: the sampler (CPU clocks,
NVML, amdsmi, RAPL), energy and power from its samples, whether a run shared its machine, the
interpreter's pauses, the benchmarks' timed window and the live status line. What a machine is and
can do is hardware/'s."""
