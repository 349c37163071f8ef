"""``[train.system]``: where and how the step runs: device, processes, numerics, kernels, threads."""
from __future__ import annotations

from dataclasses import dataclass

from speechperf.section import doc_of, setting

DIST_BACKENDS = ("auto", "gloo", "nccl", "cpu:gloo,cuda:nccl")  # train.system.dist_backend values
AUTO_PRECISION = "auto"  # train.system.precision: the fastest native precision, measured (train/auto_precision.py)
PRECISIONS = (AUTO_PRECISION, "fp32", "bf16", "fp16", "fp8")  # train.system.precision values
CTC_KERNELS = ("numba", "torch")  # train.system.ctc_kernel values


@dataclass(frozen=True)
class SystemConfig:
    """How the run executes, not what it trains (apart from the precision)."""

    device: str = setting("auto", '"auto" (cuda:LOCAL_RANK if CUDA, else cpu), "cpu", "cuda" (the local rank\'s '
                          'GPU), "cuda:N"')
    dist_backend: str = setting("auto", 'process group under torchrun: "auto" (gloo on CPU, "cpu:gloo,cuda:nccl" on '
                                'GPU), "gloo", "nccl", "cpu:gloo,cuda:nccl"')
    precision: str = setting("fp32", '"auto" (the fastest this device runs natively, measured on the run\'s own '
                             'step before the clock; config.json records the one chosen), "fp32", "bf16" (autocast, '
                             'CPU and GPU), "fp16" (GPU, with a scaler) or "fp8" (bf16 autocast with torchao\'s '
                             'float8 Linear layers, models/fp8.py: native on CUDA compute capability 8.9+, emulated '
                             'on a CPU)')
    deterministic: bool = setting(False, "deterministic kernels (cuDNN, cuBLAS workspace, CTC on the CPU): a resumed "
                                  "GPU run equals the uninterrupted one, slower")
    sync_every: int = setting(1, "read losses and skip flags from the device every N steps (and at sentences, "
                              "checkpoints, epoch end; the time cap is checked there): one host sync per N steps")
    compile: bool = setting(False, "torch.compile the model (off unless measured faster; the first steps compile)")
    cuda_graphs: bool = setting(False, "replay the training step's forward and backward from CUDA graphs, batches "
                                "padded to a grid of shapes (train/graphs.py; model ds2, one CUDA device)")
    graph_frames: int = setting(16, "cuda_graphs: a batch's frames padded up to a multiple of this")
    graph_batch: int = setting(8, "cuda_graphs: a batch's utterances padded up to a multiple of this (padding rows "
                               "have no valid frame)")
    ctc_kernel: str = setting("numba", '"numba": the CTC loss on a CPU by speechperf\'s kernel (objectives/ctc_cpu.py: '
                              'float64, several times faster than torch\'s); "torch": F.ctc_loss everywhere (on a GPU '
                              'always torch\'s; the same loss, other float sums: a reproduction takes its curve\'s)')
    threads: int = setting(0, "torch intra-op threads; 0 = torch default")
    checkpoint_every: int = setting(250, "atomic checkpoint every N iterations")

    def problems(self) -> list[str]:
        """One message per value that cannot run, naming ``train.system.FIELD=value``."""
        checks = [
            (self.graph_frames >= 1 and self.graph_batch >= 1,
             f"train.system.graph_frames={self.graph_frames} and train.system.graph_batch={self.graph_batch} "
             "must be >= 1"),
            (not (self.cuda_graphs and self.compile),
             "train.system.cuda_graphs and train.system.compile cannot both be on: pick one"),
            (self.threads >= 0, f"train.system.threads={self.threads} must be >= 0 (0 = torch default)"),
            (self.precision in PRECISIONS,
             f"train.system.precision={self.precision!r} must be one of {', '.join(PRECISIONS)}"),
            (self.ctc_kernel in CTC_KERNELS,
             f"train.system.ctc_kernel={self.ctc_kernel!r} must be one of {', '.join(CTC_KERNELS)}"),
            (self.checkpoint_every >= 1, f"train.system.checkpoint_every={self.checkpoint_every} must be >= 1"),
            (self.sync_every >= 1, f"train.system.sync_every={self.sync_every} must be >= 1 "
                                   f"({doc_of(SystemConfig, 'sync_every')})"),
            (self.dist_backend in DIST_BACKENDS,
             f"train.system.dist_backend={self.dist_backend!r} must be one of {', '.join(DIST_BACKENDS)}"),
        ]
        return [msg for ok, msg in checks if not ok]
