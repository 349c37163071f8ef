"""Multi-node as a user runs it: two torchrun commands, one process each, meeting at a c10d
rendezvous (here both on this machine), under DDP (sync) and DiLoCo (local SGD with an outer
optimizer, made for training across machines); the two-node DiLoCo run equals the same run as two
processes of one node (tests/train/test_algorithms_run.py's, trained once for both files)."""
import json

import pytest
import torch

from speechperf.drive.sweep import free_port
from speechperf.results import ResultsDB
from speechperf.results.checkpoint import load as load_checkpoint
from tests.conftest import torchrun_start
from tests.train.test_algorithms_run import ARGS as ONE_NODE_ARGS, RUNS, runs  # noqa: F401 (runs: a fixture)

ARGS = ["--preset", "tiny", "max_epochs=1", "threads=1", "device=cpu", "final_splits=none"]


def _nodes(feats, out, extra, port) -> list:
    """``torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT``,
    twice, each one's output in OUT.nodeI.log."""
    argv = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", f"test-{port}", "-m", "speechperf", "train", "--data", feats, "--out", out, *ARGS, *extra]
    return [torchrun_start(*argv, output=f"{out}.node{i}.log") for i in range(2)]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", ["sync", "diloco"])
def test_two_nodes_of_one_process_train_one_run(name, tiny_features, tmp_path, request):
    run = tmp_path / "two-nodes"
    extra = [] if name == "sync" else [*ONE_NODE_ARGS[len(ARGS):], *RUNS[name][1]]  # diloco: the one-node run's
    nodes = _nodes(tiny_features, run, extra, free_port())
    codes = [p.wait(timeout=300) for p in nodes]
    assert codes == [0, 0], "\n".join(p.stdout_text()[-3000:] for p in nodes)
    summary = json.loads((run / "summary.json").read_text())
    env = json.loads((run / "env.json").read_text())
    assert summary["status"] == "success" and env["world_size"] == 2
    run_id = json.loads((run / "run.json").read_text())["run_id"]
    with ResultsDB(run / "results.db", readonly=True) as db:
        sent = [r["comm_bytes"] for r in db.query("SELECT comm_bytes FROM iterations WHERE run_id = ?", [run_id])]
    assert sum(sent) > 0  # the ranks talked across the "nodes"
    if name == "diloco":  # the same ranks on the same data as one node of two processes: the same weights
        one = request.getfixturevalue("runs") / name
        a, b = load_checkpoint(run)["model"], load_checkpoint(one)["model"]
        for k, v in a.items():
            assert torch.equal(v, b[k]), k
