"""``train.system.precision=fp8`` through the real loop on the CPU (torchao's emulation): refused in one line
before a run folder exists unless ``--allow-emulated`` and for a model with no layer fp8 can swap; a run
killed after a mid-epoch checkpoint resumes bit for bit, and its checkpoint is data only (no torchao
object pickled), the plain model's keys; sharded (fsdp) on 2 gloo ranks under torchrun it trains and
saves the same data-only checkpoint."""
import json
import signal
import zipfile

import torch

from speechperf.cli import main
from speechperf.results.checkpoint import load as load_checkpoint
from tests.conftest import cli, cli_start, torchrun, torchrun_args
from tests.train.test_resume_mid_epoch import CONFORMER, _kill_after_a_mid_epoch_checkpoint, _rows

FP8 = ["train.system.precision=fp8"]


def _args(feats, out, *extra):
    return ["train", "--preset", "tiny", "--data", str(feats), "--out", str(out), "--json", "threads=1",
            "max_epochs=2", "checkpoint_every=2", "sentence_every=50", "loader.readers=1", "train.eval.final_splits=none",
            *CONFORMER, *FP8, *extra]


def test_fp8_on_a_cpu_is_refused_unless_emulation_is_allowed(tiny_features, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(_args(tiny_features, run)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "train.system.precision=fp8 is emulated on this CPU" in err
    assert "--allow-emulated" in err and "9 of 10 Linear layers in float8" in err
    assert not run.exists()
    assert main(["train", "--preset", "tiny", "--data", str(tiny_features), "--out", str(run), "--allow-emulated",
                 "train.system.precision=fp8"]) == 2  # DS2: its only Linear layer has 30 outputs
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and not run.exists()
    assert "no Linear layer of this model can train in float8 (fc: out_features 30 not a multiple of 16)" in err


def _globals(checkpoint) -> bytes:
    """The pickle stream of a torch checkpoint (its data.pkl): every class it names is spelled there."""
    with zipfile.ZipFile(checkpoint) as z:
        return b"".join(z.read(n) for n in z.namelist() if n.endswith("data.pkl"))


def test_an_fp8_run_resumes_bit_exactly_and_its_checkpoint_is_data_only(tiny_features, tmp_path):
    ref, run = tmp_path / "ref", tmp_path / "run"
    p = cli(*_args(tiny_features, ref, "--allow-emulated"))
    assert p.returncode == 0, p.stderr
    p = cli_start(*_args(tiny_features, run, "--allow-emulated"))
    assert _kill_after_a_mid_epoch_checkpoint(p, run) == -signal.SIGKILL
    p = cli(*_args(tiny_features, run, "--allow-emulated"))
    assert p.returncode == 0, p.stderr

    sql = "SELECT iteration, loss FROM iterations WHERE run_id = ? ORDER BY iteration"
    assert _rows(run, sql) == _rows(ref, sql)  # every loss, bit for bit
    a, b = load_checkpoint(ref), load_checkpoint(run)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    pickled = _globals(ref / "checkpoint.pt")
    assert b"torch" in pickled and b"torchao" not in pickled and b"Float8" not in pickled
    assert all(type(v) is torch.Tensor for v in a["model"].values())  # noqa: E721
    assert "blocks.0.ff1.net.1.weight" in a["model"] and a["config"]["train"]["system"]["precision"] == "fp8"
    note = json.loads((ref / "env.json").read_text())["precision_note"]
    assert note.startswith("emulated: no FP8 tensor cores on a CPU") and note.endswith(
        "9 of 10 Linear layers in float8, the others in bf16 (head: out_features 30 not a multiple of 16)")


def test_fp8_sharded_on_two_ranks_trains_and_saves_a_plain_checkpoint(tiny_features, tmp_path):
    run = tmp_path / "run"
    p = torchrun(*torchrun_args(*_args(tiny_features, run, "algo.name=fsdp", "max_epochs=1", "--allow-emulated")))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)[0]["status"] == "success"
    ckpt = load_checkpoint(run)
    assert b"torchao" not in _globals(run / "checkpoint.pt") and ckpt["config"]["algo"]["name"] == "fsdp"
    assert all(type(v) is torch.Tensor for v in ckpt["model"].values())  # noqa: E721 (whole, unsharded)
    assert ckpt["model"]["blocks.0.ff1.net.1.weight"].shape == (64, 16)
