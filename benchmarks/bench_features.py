"""Feature extraction speed: speechperf (torch) vs librosa on the same audio, same process.

Goal: ours / librosa throughput >= 1. Audio: FLAC files of a prepared corpus if
a folder is given (e.g. demo/corpus), else synthesized speech-like signals.
Usage: python benchmarks/bench_features.py [CORPUS] [--files N]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _timing import measure, show  # noqa: E402

from speechperf.features.feature_config import FeatureConfig  # noqa: E402
from speechperf.features.extract import extract  # noqa: E402


def librosa_features(wave, cfg):
    import librosa

    S = librosa.feature.melspectrogram(y=wave, sr=cfg.sample_rate, n_fft=cfg.n_fft, hop_length=cfg.hop_length,
                                       win_length=cfg.win_length, center=True, pad_mode="constant", n_mels=cfg.n_mels,
                                       fmin=cfg.f_min, fmax=cfg.f_max)
    L = librosa.power_to_db(S, amin=cfg.log_floor, top_db=None)
    return np.concatenate([L, librosa.feature.mfcc(S=L, n_mfcc=cfg.n_mfcc, norm="ortho")]).T


def load(corpus: Path | None, n: int) -> list[np.ndarray]:
    if corpus:
        files = sorted(corpus.rglob("*.flac"))[:n]
        return [sf.read(f, dtype="float32")[0] for f in files]
    rng = np.random.default_rng(0)
    return [rng.standard_normal(int(16000 * s)).astype(np.float32) * 0.1 for s in rng.uniform(1, 15, n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus", nargs="?", type=Path)
    ap.add_argument("--files", type=int, default=100)
    a = ap.parse_args()
    cfg = FeatureConfig()
    waves = load(a.corpus, a.files)
    audio_s = sum(len(w) for w in waves) / cfg.sample_rate
    print(f"{len(waves)} utterances, {audio_s:.0f} s of audio; torch {torch.__version__}")
    for threads in (1, 2):
        torch.set_num_threads(threads)
        ours = measure(lambda: [extract(w, cfg) for w in waves])
        ref = measure(lambda: [librosa_features(w, cfg) for w in waves])
        print(f"threads={threads}  " + show("speechperf", ours) + f" -> {audio_s / ours['median']:.0f}x realtime")
        print(f"threads={threads}  " + show("librosa   ", ref) + f" -> {audio_s / ref['median']:.0f}x realtime")
        print(f"threads={threads}  ratio speechperf / librosa throughput: {ref['median'] / ours['median']:.2f}")


if __name__ == "__main__":
    main()
