"""What a machine is and can do: the environment a run records, platforms and their prices, the
peaks (vendor figures and the measured one), what a device does with a precision, the ISA cap and
its kernel fingerprints, how a machine is named, a model's FLOPs (MFU) and memory per device. The
readers that sample the machine while it works are telemetry/'s."""
