"""``[train.eval]``: the evaluations: every epoch's, the final one and the logged sentences."""
from __future__ import annotations

from dataclasses import dataclass

from speechperf.decode import WORDBEAM_MODES
from speechperf.section import setting


@dataclass(frozen=True)
class EvalConfig:
    """What is evaluated, how it is decoded and with what resources."""

    split: str = setting("dev-clean", "validation split evaluated every epoch")
    final_splits: str = setting("", 'comma-separated final-eval splits; "" = dev/test-clean/other prepared; '
                                '"none" = no final evaluation')
    decoder: str = setting("greedy", "decoder registry key for per-epoch evaluation (and the final one)")
    beam: int = setting(256, "beam width for per-epoch evaluation (paper 256)")
    final_beam: int = setting(512, "beam width for the final evaluation (paper 512)")
    mode: str = setting("ngrams", "word beam search mode (wordbeam only): words, ngrams, ngrams_forecast, "
                        "ngrams_forecast_sample")
    threads: int = setting(0, "threads decoding the evaluations (beside the forward pass); 0 = auto: the CPUs "
                           "this process may use, less the loader's readers (at least half)")
    # 4 GiB holds LibriSpeech's dev-clean (5.4 h: ~0.75 GiB padded float32) with room for dev-other-sized splits
    resident_mb: int = setting(4096, "MiB the eval split's padded batches may take to be built once before the "
                               "clock and kept (GPU, else pinned host memory); larger: read from the shards every "
                               "evaluation; 0 = always read")
    sentence_every: int = setting(50, "greedy-decode the current batch and log it every N iterations")

    def problems(self) -> list[str]:
        """One message per value that cannot run, naming ``train.eval.FIELD=value``."""
        checks = [
            (self.beam >= 1 and self.final_beam >= 1,
             f"train.eval.beam={self.beam} and train.eval.final_beam={self.final_beam} must be >= 1"),
            (self.resident_mb >= 0, f"train.eval.resident_mb={self.resident_mb} must be >= 0 (0 = always read)"),
            (self.threads >= 0, f"train.eval.threads={self.threads} must be >= 0 (0 = auto)"),
            (self.sentence_every >= 1, f"train.eval.sentence_every={self.sentence_every} must be >= 1"),
            (self.mode in WORDBEAM_MODES,
             f"train.eval.mode={self.mode!r} must be one of {', '.join(WORDBEAM_MODES)}"),
        ]
        return [msg for ok, msg in checks if not ok]
