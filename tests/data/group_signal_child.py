"""``python -m tests.data.group_signal_child FEATS TRIES OUT`` (tests/data/test_loader_group_signal.py
starts it in a process group of its own and sends the group SIGTERM the moment each try's reader
appears): TRIES times, a loader's readers started under the training loop's stop signals
(train/stop.py), then, once the signal is taken, a batch read and the loader closed. OUT gets one
entry per try (JSON): the signal's number it took, or the error that ended the try."""
import json
import sys
import time

from speechperf.data.loader import load_index, make_loader
from speechperf.data.loader_config import LoaderConfig
from speechperf.train.stop import StopSignals

feats, tries, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
index = load_index(feats, ["train-clean"])
cfg = LoaderConfig(batch_size=4, readers=1, bucket_window=1)  # a first batch of one shard
results = []
with StopSignals() as stop:
    for _ in range(tries):
        try:
            with make_loader(feats, "train-clean", cfg, epoch=1, seed=0, index=index) as loader:
                loader.start()
                waited = time.monotonic() + 10
                while stop.requested is None and time.monotonic() < waited:  # the test's signal, once a reader shows
                    time.sleep(0.001)
                next(iter(loader))
            results.append(stop.requested)
        except Exception as e:  # a reader killed by the signal: torch's "DataLoader worker ... killed"
            results.append(f"{type(e).__name__}: {e}")
        stop.requested = None
with open(out, "w") as f:
    json.dump(results, f)
