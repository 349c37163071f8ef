import numpy as np
import pytest

librosa = pytest.importorskip("librosa")

from speechperf.features.feature_config import FeatureConfig  # noqa: E402
from speechperf.features.extract import dct_matrix, extract, extract_batch, frame_count, mel_filters  # noqa: E402

# Tolerance against librosa: float32 FFT vs librosa's own, measured max 0.002 dB on log-mel.
TOL_DB = 0.01


def librosa_features(wave, cfg):
    S = librosa.feature.melspectrogram(y=wave, sr=cfg.sample_rate, n_fft=cfg.n_fft, hop_length=cfg.hop_length,
                                       win_length=cfg.win_length, window="hann", center=True, pad_mode="constant",
                                       power=2.0, n_mels=cfg.n_mels, fmin=cfg.f_min, fmax=cfg.f_max)
    L = librosa.power_to_db(S, ref=1.0, amin=cfg.log_floor, top_db=None)
    C = librosa.feature.mfcc(S=L, n_mfcc=cfg.n_mfcc, dct_type=2, norm="ortho")
    return np.concatenate([L, C]).T


def speechlike(seconds=2.3, seed=0):
    rng = np.random.default_rng(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    f0 = 120 + 30 * np.sin(2 * np.pi * 0.7 * t)
    x = sum(np.sin(2 * np.pi * k * np.cumsum(f0) / 16000) / k for k in range(1, 20))
    return (0.1 * x * (1 + np.sin(2 * np.pi * 3 * t)) + 0.01 * rng.standard_normal(len(t))).astype(np.float32)


def test_matches_librosa_within_tolerance():
    cfg = FeatureConfig()
    for seed in range(3):
        w = speechlike(1.0 + seed, seed)
        ours, ref = extract(w, cfg), librosa_features(w, cfg)
        assert ours.shape == ref.shape == (frame_count(len(w), cfg), 93)
        assert np.abs(ours[:, :80] - ref[:, :80]).max() < TOL_DB
        assert np.abs(ours[:, 80:] - ref[:, 80:]).max() < TOL_DB


def test_filters_and_dct_equal_references():
    cfg = FeatureConfig()
    ref = librosa.filters.mel(sr=16000, n_fft=512, n_mels=80, fmin=0, fmax=8000)
    assert np.allclose(mel_filters(cfg), ref, atol=1e-7)
    from scipy.fft import dct

    x = np.random.default_rng(1).standard_normal((5, 80))
    assert np.allclose(x @ dct_matrix(80, 13), dct(x, type=2, norm="ortho", axis=1)[:, :13])


def test_batch_equals_single_and_is_deterministic():
    waves = [speechlike(s, i) for i, s in enumerate((0.5, 1.7, 3.1))]
    batch = extract_batch(waves)
    for w, b in zip(waves, batch):
        assert np.array_equal(extract(w), b)
    assert frame_count(16000, FeatureConfig()) == 101  # 10 ms hop, centred
