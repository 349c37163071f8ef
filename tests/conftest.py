"""Shared fixtures: one tiny synthesized corpus and its features per test session."""
from __future__ import annotations

import pytest

TINY_HOURS = 0.03  # about a hundred short train utterances: seconds to synthesize and prepare


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory):
    from speechperf.corpus.synth import synthesize

    root = tmp_path_factory.mktemp("corpus")
    synthesize(root, hours=TINY_HOURS, seed=3, progress=False)
    return root


@pytest.fixture(scope="session")
def tiny_features(tiny_corpus, tmp_path_factory):
    from speechperf.features.prepare import prepare

    out = tmp_path_factory.mktemp("features")
    prepare(tiny_corpus, out, progress=False, workers=1)
    return out
