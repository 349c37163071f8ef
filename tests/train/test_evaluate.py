"""The evaluation pass's loader: in order, and every reader given work."""
from dataclasses import replace

import numpy as np

from speechperf.config import load_preset
from speechperf.data.index import librispeech_like
from speechperf.data.loader import owners
from speechperf.data.plan import plan_epoch
from speechperf.train.evaluate import eval_loader


def test_every_reader_gets_a_share_of_a_dev_split_and_one_reader_keeps_the_training_windows():
    dev = librispeech_like(0, splits=(2_703,))  # dev-clean's size: 43 shards of 64
    shards = len(dev.keys)
    for preset in ("gpu", "modern", "conformer", "conformer-algoperf-sizes", "paper"):
        train = load_preset(preset).loader
        cfg = eval_loader(train, shards)
        assert not cfg.shuffle and cfg.mode == "bucket" and not cfg.sort_first_epoch
        plan = plan_epoch(dev, cfg, 0, 0)
        assert set(owners(plan, cfg.readers).tolist()) == set(range(cfg.readers)), preset  # none idle
        assert sorted(np.concatenate(plan.batches).tolist()) == list(range(len(dev.frames)))  # every utterance once
        whole = plan_epoch(dev, replace(cfg, bucket_window=train.bucket_window), 0, 0)
        if train.bucket_window >= shards:  # the training window: one run, one reader did it all
            assert set(owners(whole, cfg.readers).tolist()) == {0}
    for preset in ("cpu", "conformer-cpu", "tiny"):  # one reader (or none): the windows the references used
        train = load_preset(preset).loader
        assert eval_loader(train, shards).bucket_window == train.bucket_window
