"""Feature extraction configuration (docs/spec.md A)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FeatureConfig:
    """How audio becomes the 93-dim frames the DS2 model reads; stored with every shard set."""

    sample_rate: int = 16000  # Hz; other rates are rejected, not resampled silently
    n_fft: int = 512  # FFT size in samples (32 ms at 16 kHz)
    win_length: int = 512  # analysis window in samples (Hann)
    hop_length: int = 160  # frame shift in samples (10 ms)
    n_mels: int = 80  # log-mel bands
    n_mfcc: int = 13  # cepstral coefficients (DCT-II, ortho, of the log-mel bands)
    f_min: float = 0.0  # lowest mel filter edge, Hz
    f_max: float = 8000.0  # highest mel filter edge, Hz (Nyquist)
    log_floor: float = 1e-10  # power floor before log10, as librosa's power_to_db amin
    center: bool = True  # frames centred on hop multiples, constant (zero) padding
    utts_per_shard: int = 64  # utterances per compressed shard
    max_seconds: float = 16.7  # drop longer utterances (1670 frames)
    min_frames: int = 11  # drop shorter utterances: the conv kernel is 11 frames
    compress: bool = True  # shards' arrays deflated; False (prepare --raw): stored as they are, 1.2x the
    # disk for about half a reader's CPU (ledger: bench_shard_format); same values either way

    @property
    def dim(self) -> int:
        """Feature dimension per frame: log-mel + MFCC (93 by default)."""
        return self.n_mels + self.n_mfcc
