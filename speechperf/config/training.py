"""Training loop configuration (docs/spec.md C)."""
from __future__ import annotations

from dataclasses import dataclass

from speechperf import metric
from speechperf.decode import WORDBEAM_MODES

DIST_BACKENDS = ("auto", "gloo", "nccl", "cpu:gloo,cuda:nccl")  # train.dist_backend values
SCHEDULES = ("epoch_decay", "step", "noam", "cosine", "newbob")  # train.lr_schedule values (train/schedule.py)
# train.protocol values: the benchmark protocols whose workload speechperf implements. Only its
# own; AlgoPerf's ("algoperf": its frontend, SentencePiece outputs, models and padding) is not
# implemented, so no run can claim it (scoring/targets.py refuses AlgoPerf's targets for these runs).
PROTOCOLS = ("speechperf",)
OPTIMIZERS = ("adadelta", "adamw", "sgd", "lamb")  # train.optimizer values (train/step.py's make_optimizer)
AUTO_PRECISION = "auto"  # train.precision: the fastest native precision, measured (train/auto_precision.py)
PRECISIONS = (AUTO_PRECISION, "fp32", "bf16", "fp16", "fp8")  # train.precision values


@dataclass(frozen=True)
class TrainConfig:
    """The training state machine, optimizer and stopping rule."""

    protocol: str = "speechperf"  # the benchmark protocol the run follows (PROTOCOLS):
    # which named TTA target sets apply
    seed: int = 1  # seeds model init, data order and dropout
    optimizer: str = "adadelta"  # "adadelta" (paper), "adamw", "sgd" (plain SGD, paper 003's local optimizer) or
    # "lamb" (MLPerf's RNN-T: Adam's moments with a per-tensor trust ratio, train/lamb.py)
    lr: float = 1.0  # learning rate (AdaDelta's default 1.0)
    weight_decay: float = 0.0  # decoupled weight decay (adamw) / L2 (adadelta)
    warmup_iters: int = 0  # linear warm-up: step s (from 0) of the first N runs at lr x (s+1)/N, any schedule
    lr_schedule: str = "epoch_decay"  # learning rate per step (train/schedule.py): "epoch_decay" (lr x lr_decay^epochs
    # done), "step" (lr x lr_decay^(epochs done // lr_step_epochs), torch's StepLR), "noam" (warm-up, then x
    # sqrt(warmup_iters/step)), "cosine" (warm-up, then down to lr_min over max_epochs), "newbob" (halved every epoch
    # once the validation loss improves < 1%; stops once it then improves < 0.1%)
    lr_decay: float = 1.0  # epoch_decay: multiply the learning rate by this after every epoch; step: after every
    # lr_step_epochs epochs
    lr_step_epochs: int = 1  # step: epochs between two multiplications by lr_decay (StepLR's step_size)
    lr_min: float = 0.0  # cosine: the learning rate at the end of max_epochs epochs (<= lr)
    grad_clip: float = 400.0  # max global gradient norm (DS2 practice); 0 disables
    max_epochs: int = 50  # stop after this many epochs
    time_cap_minutes: float = 0.0  # stop when the TTA clock passes this; 0 = no cap
    stop_after_epochs: int = 0  # stop after this many epochs, max_epochs unchanged (the cosine's length): a reference's
    # first epochs, reproduced (drive/reproduce.py); 0 = off
    sentence_every: int = 50  # greedy-decode the current batch and log it every N iterations
    checkpoint_every: int = 250  # atomic checkpoint every N iterations
    train_splits: str = ""  # comma-separated splits to train on; "" = every train-* split prepared (all intact)
    eval_split: str = "dev-clean"  # validation split evaluated every epoch
    final_splits: str = ""  # comma-separated final-eval splits; "" = dev/test-clean/other prepared; "none"
    eval_decoder: str = "greedy"  # decoder registry key for per-epoch evaluation
    eval_beam: int = 256  # beam width for per-epoch evaluation (paper 256)
    eval_mode: str = "ngrams"  # word beam search mode (wordbeam only): words, ngrams, ngrams_forecast,
    # ngrams_forecast_sample
    eval_threads: int = 0  # threads decoding the evaluations (beside the forward pass); 0 = auto: the CPUs this process
    # may use, less the loader's readers (at least half)
    # 4 GiB holds LibriSpeech's dev-clean (5.4 h: ~0.75 GiB padded float32) with room for dev-other-sized splits
    eval_resident_mb: int = 4096  # MiB the eval split's padded batches may take to be built once before the clock and
    # kept (GPU, else pinned host memory); larger: read from the shards every evaluation; 0 = always read
    final_beam: int = 512  # beam width for the final evaluation (paper 512)
    target_metric: str = metric.DEFAULT_TARGET  # what the stop rule watches: a target metric of speechperf/metric.py
    target: float = 0.0  # stop once the median of the last target_epochs evals is <= this (percent); 0 = never
    target_epochs: int = 3  # e of TTA(a, e)
    precision: str = "fp32"  # "auto" (the fastest this device runs natively, measured on the run's own step before the
    # clock; config.json records the one chosen), "fp32", "bf16" (autocast, CPU and GPU) "fp16" (GPU, with a scaler) or
    # "fp8" (bf16 autocast with torchao's float8 Linear layers, models/fp8.py: native on CUDA compute capability 8.9+,
    # emulated on a CPU)
    device: str = "auto"  # "auto" (cuda:LOCAL_RANK if CUDA, else cpu), "cpu", "cuda" (the local rank's GPU), "cuda:N"
    dist_backend: str = "auto"  # process group under torchrun: "auto" (gloo on CPU, "cpu:gloo,cuda:nccl" on GPU),
    # "gloo", "nccl", "cpu:gloo,cuda:nccl"
    deterministic: bool = False  # deterministic kernels (cuDNN, cuBLAS workspace, CTC on the CPU): a resumed GPU run
    # equals the uninterrupted one, slower
    sync_every: int = 1  # read losses and skip flags from the device every N steps (and at sentences, checkpoints,
    # epoch end; the time cap is checked there): one host sync per N steps
    optimizer_impl: str = "default"  # "default", "foreach" or "fused" (AdamW; fewer, larger kernels on a GPU)
    floor_steps: int = 0  # after training, outside the clock: replay this many steps, spread over the epochs in windows
    # of floor_window steps (at most 10% of the clock), on batches already on the device and set the loop's rows against
    # them (train/floor.py; the summary's "floor"); 0 = off
    floor_window: int = 0  # floor_steps: the timed steps of one replayed window, rounded up to whole sync_every
    # periods; 0 = one period (a CPU step's seconds vary: a window of several steps times steadier)
    compile: bool = False  # torch.compile the model (off unless measured faster; the first steps compile)
    cuda_graphs: bool = False  # replay the training step's forward and backward from CUDA graphs, batches padded to a
    # grid of shapes (train/graphs.py; model ds2, one CUDA device)
    graph_frames: int = 16  # cuda_graphs: a batch's frames padded up to a multiple of this
    graph_batch: int = 8  # cuda_graphs: a batch's utterances padded up to a multiple of this (padding rows have no
    # valid frame)
    threads: int = 0  # torch intra-op threads; 0 = torch default
    max_bad_losses: int = 100  # abort after this many consecutive NaN/inf losses
    max_skipped_fraction: float = 0.5  # diverged when more than this share of the steps so far were skipped

    def _optimizer_checks(self) -> list[tuple[bool, str]]:
        """(ok, message) of the optimizer's and the schedule's values (and stop_after_epochs), in problems()'s order."""
        return [
            (self.stop_after_epochs >= 0, f"train.stop_after_epochs={self.stop_after_epochs} must be >= 0 (0 = off)"),
            (self.optimizer in OPTIMIZERS,
             f"train.optimizer={self.optimizer!r} must be one of {', '.join(OPTIMIZERS)}"),
            (self.lr > 0, f"train.lr={self.lr} must be > 0"),
            (self.weight_decay >= 0, f"train.weight_decay={self.weight_decay} must be >= 0"),
            (self.warmup_iters >= 0, f"train.warmup_iters={self.warmup_iters} must be >= 0"),
            (self.lr_decay > 0, f"train.lr_decay={self.lr_decay} must be > 0"),
            (self.lr_step_epochs >= 1, f"train.lr_step_epochs={self.lr_step_epochs} must be >= 1"),
            (self.lr_schedule in SCHEDULES,
             f"train.lr_schedule={self.lr_schedule!r} must be one of {', '.join(SCHEDULES)}"),
            (self.lr_schedule != "noam" or self.warmup_iters >= 1,
             f"train.lr_schedule=noam needs train.warmup_iters >= 1 (its peak), not {self.warmup_iters}"),
            (0 <= self.lr_min <= self.lr, f"train.lr_min={self.lr_min} must be in [0, train.lr={self.lr}]"),
            (self.grad_clip >= 0, f"train.grad_clip={self.grad_clip} must be >= 0 (0 disables clipping)"),
        ]

    def problems(self) -> list[str]:
        """One message per value that would fail later or cannot train, naming ``train.FIELD=value``."""
        checks = self._optimizer_checks() + [
            (self.time_cap_minutes >= 0, f"train.time_cap_minutes={self.time_cap_minutes} must be >= 0 (0 = no cap)"),
            (self.target == 0 or metric.is_target(self.target),
             f"train.target={self.target!r} must be an error rate in (0, 100] % (or 0: never stop early)"),
            (self.eval_beam >= 1 and self.final_beam >= 1,
             f"train.eval_beam={self.eval_beam} and train.final_beam={self.final_beam} must be >= 1"),
            (self.eval_resident_mb >= 0,
             f"train.eval_resident_mb={self.eval_resident_mb} must be >= 0 (0 = always read)"),
            (self.eval_threads >= 0, f"train.eval_threads={self.eval_threads} must be >= 0 (0 = auto)"),
            (self.floor_steps >= 0, f"train.floor_steps={self.floor_steps} must be >= 0 (0 = off)"),
            (self.floor_window >= 0,
             f"train.floor_window={self.floor_window} must be >= 0 (0 = one sync_every period)"),
            (self.graph_frames >= 1 and self.graph_batch >= 1,
             f"train.graph_frames={self.graph_frames} and train.graph_batch={self.graph_batch} must be >= 1"),
            (not (self.cuda_graphs and self.compile),
             "train.cuda_graphs and train.compile cannot both be on: pick one"),
            (self.threads >= 0, f"train.threads={self.threads} must be >= 0 (0 = torch default)"),
            (self.max_bad_losses >= 0, f"train.max_bad_losses={self.max_bad_losses} must be >= 0"),
            (0 < self.max_skipped_fraction <= 1,
             f"train.max_skipped_fraction={self.max_skipped_fraction} must be in (0, 1]"),
            (self.precision in PRECISIONS,
             f"train.precision={self.precision!r} must be one of {', '.join(PRECISIONS)}"),
            (self.target_metric in metric.targets(),
             f"train.target_metric={self.target_metric!r} must be one of {', '.join(metric.targets())}"),
            (self.sentence_every >= 1 and self.checkpoint_every >= 1,
             "train.sentence_every and checkpoint_every must be >= 1"),
            (self.target_epochs >= 1, f"train.target_epochs={self.target_epochs} must be >= 1"),
            (self.max_epochs >= 1, f"train.max_epochs={self.max_epochs} must be >= 1"),
            (self.sync_every >= 1, f"train.sync_every={self.sync_every} must be >= 1"),
            (self.dist_backend in DIST_BACKENDS,
             f"train.dist_backend={self.dist_backend!r} must be one of {', '.join(DIST_BACKENDS)}"),
            (self.optimizer_impl in ("default", "foreach", "fused"),
             f"train.optimizer_impl={self.optimizer_impl!r} must be default, foreach or fused"),
            (self.optimizer_impl == "default" or self.optimizer != "lamb",
             f"train.optimizer_impl={self.optimizer_impl!r}: lamb has one implementation (default)"),
            (self.optimizer_impl != "fused" or self.optimizer == "adamw",
             f"train.optimizer_impl=fused needs optimizer=adamw (torch has no fused {self.optimizer})"),
            (self.eval_mode in WORDBEAM_MODES,
             f"train.eval_mode={self.eval_mode!r} must be one of {', '.join(WORDBEAM_MODES)}"),
            (self.protocol in PROTOCOLS,
             f"train.protocol={self.protocol!r}: speechperf implements only {', '.join(PROTOCOLS)} "
             "(no AlgoPerf-faithful workload yet)"),
        ]
        return [msg for ok, msg in checks if not ok]


def target_rule(train: dict) -> tuple[str, float, int]:
    """A run's stop rule from its configuration's ``train`` section (a recorded one as ``Run.config``
    reads it: results/upgrade.py fills in a field recorded after the run): (target metric, target:
    0 for none, evaluations whose median must reach it). The readers of finished runs (study,
    sweep) share it."""
    return train["target_metric"], train["target"], train["target_epochs"]
