"""Data loader configuration (docs/spec.md A, Table 2)."""
from __future__ import annotations

from dataclasses import dataclass

from speechperf.data.units import spec_problem


@dataclass(frozen=True)
class LoaderConfig:
    """How shards become batches: readers, shuffle, bucketing or paper padding, prefetch."""

    batch_size: int = 24  # utterances per batch (total over all devices); unused when max_duration > 0
    max_duration: float = 0.0  # > 0: batches by audio instead, at most this many padded seconds per batch per rank
    quadratic_duration: float = 0.0  # > 0: an utterance of d s counts d + d^2 / this against max_duration (lhotse's)
    balance: bool = False  # fixed counts: cut each window into near-equal batches (no small remainder batch);
    # False keeps the cut the tiny references were measured with (full batches + remainder)
    readers: int = 1  # parallel reader processes (DataLoader workers); 0 = in-process
    prefetch_batches: int = 8  # whole batches buffered ahead of the training loop
    mode: str = "bucket"  # "bucket": length-bucketed batches; "pad": every utterance to pad_frames
    pad_frames: int = 1670  # paper mode pads every utterance to this many frames
    pad_multiple: int = 1  # bucket mode: a batch's frames rounded up to a multiple of this (1: its longest
    # utterance's). Fewer distinct shapes: a CPU step of a shape not seen before makes oneDNN create its
    # primitives again (docs/presets.md); a reference recipe field (the padded sums round otherwise)
    bucket_window: int = 8  # shards mixed per bucketing window (locality vs randomness)
    shuffle: bool = True  # shuffle shard and batch order each epoch (seeded)
    normalize: bool = True  # per-feature mean/variance normalization with train-set statistics
    sort_first_epoch: bool = False  # SortaGrad: first epoch in ascending length order
    eval_max_duration: float = 0.0  # > 0: evaluation batches of at most this many padded seconds; 0: the training ones
    # (no backward pass: a GPU holds several training batches, and a launch-bound forward pass costs per batch)
    resident: bool = False  # keep the training split on the training device after the first epoch, which
    # streams as always; later epochs cut their batches from it, no readers (data/resident.py); a run
    # whose buffer does not fit the device's free memory is refused before it starts
    units: str = "char"  # the labels' units (data/units.py): "char", the 30-symbol alphabet, or "bpe:N",
    # SentencePiece BPE of N pieces trained from the training transcripts into FEATS/units/ (N + 1 classes)

    def problems(self) -> list[str]:
        """One message per invalid value, naming ``loader.FIELD=value``."""
        checks = [
            (self.batch_size >= 1, f"loader.batch_size={self.batch_size} must be >= 1"),
            (self.max_duration >= 0, f"loader.max_duration={self.max_duration} must be >= 0 (0: fixed batch_size)"),
            (self.eval_max_duration >= 0,
             f"loader.eval_max_duration={self.eval_max_duration} must be >= 0 (0: the training batches' size)"),
            (self.quadratic_duration >= 0,
             f"loader.quadratic_duration={self.quadratic_duration} must be >= 0 (0: off)"),
            (self.readers >= 0, f"loader.readers={self.readers} must be >= 0"),
            (self.prefetch_batches >= 1, f"loader.prefetch_batches={self.prefetch_batches} must be >= 1"),
            (self.bucket_window >= 1, f"loader.bucket_window={self.bucket_window} must be >= 1"),
            (self.pad_frames >= 1, f"loader.pad_frames={self.pad_frames} must be >= 1"),
            (self.pad_multiple >= 1, f"loader.pad_multiple={self.pad_multiple} must be >= 1 (1: no rounding)"),
            (self.mode in ("bucket", "pad"), f"loader.mode={self.mode!r} must be 'bucket' or 'pad'"),
            (isinstance(self.resident, bool), f"loader.resident={self.resident!r} must be true or false"),
            (spec_problem(self.units) is None, spec_problem(self.units)),
        ]
        return [msg for ok, msg in checks if not ok]


# The environment variable naming the seeds started together on one host (``train --seeds N --parallel K``
# on a CPU, drive/seed_slots.py), each filling its own loader.resident buffer from the same free memory:
# data/resident.py's check counts them all.
SIDE_BY_SIDE = "SPEECHPERF_RESIDENT_SIDE_BY_SIDE"
