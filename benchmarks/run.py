"""The benchmark suite's one entry: each benchmark measures one standing goal of the docs against a
reference measured in the same process, prints that ratio and appends its figures to the ledger
(benchmarks/ledger.jsonl, _ledger.py).

Usage (repository root):
  python benchmarks/run.py --list                    # the benchmarks, their goals and references
  python benchmarks/run.py NAME [OPTIONS...]         # one benchmark; OPTIONS: run.py NAME --help
  python benchmarks/run.py NAME NAME... [--data FEATS]
  python benchmarks/run.py --all [--data FEATS]
Runner options: --ledger PATH (default benchmarks/ledger.jsonl), --no-ledger.
--data FEATS: prepared features; a benchmark that reads features and is given none measures a
tiny corpus synthesized and prepared once for the call (the test suite's: 0.03 h, seed 3).
"""
from __future__ import annotations

import argparse
import importlib
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _ledger  # noqa: E402
import _timing  # noqa: E402
from speechperf.errors import SpeechperfError  # noqa: E402

# name: the module (benchmarks/MODULE.py) holding GOAL, REFERENCE, RATIO, DATA, arguments(p), run(a)
SUITE = {
    "step_floor": "bench_step_floor",
    "step_profile": "bench_step_profile",
    "plan": "bench_plan",
    "loader": "bench_loader",
    "prepare": "bench_prepare",
    "mfu": "bench_mfu",
    "resident": "bench_resident",
    "convergence": "bench_convergence",
    "paper_vs_modern": "bench_paper_vs_modern",
    "workloads": "bench_workloads",
    "graph_shapes": "bench_graph_shapes",
    "rnnt_loss": "bench_rnnt_loss",
    "precision": "bench_precision",
    "scale": "bench_scale",
    "fp8": "bench_fp8",
    "lstm_ceiling": "bench_lstm_ceiling",
    "optim_impl": "bench_optim_impl",
    "op_trace": "bench_op_trace",
    "transducer_beam": "bench_transducer_beam",
    "dropout": "bench_dropout",
    "pad_multiple": "bench_pad_multiple",
    "ctc": "bench_ctc",
}


def split(argv: list[str]) -> tuple[list[str], list[str]]:
    """The runner's part (its flags, anywhere, and the names, first) and the rest: the benchmarks' options."""
    head, rest, i = [], [], 0
    while i < len(argv):
        x = argv[i]
        if x in ("--no-ledger", "--list", "--all") or x.startswith("--ledger="):
            head.append(x)
        elif x == "--ledger":
            head += argv[i:i + 2]
            i += 1
        elif x in SUITE and not rest or x in ("-h", "--help") and not rest and not set(head) & set(SUITE):
            head.append(x)
        else:
            rest.append(x)
        i += 1
    return head, rest


def runner_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("names", nargs="*", choices=[[], *SUITE], metavar="NAME", help=", ".join(SUITE))
    p.add_argument("--list", action="store_true", help="the benchmarks, their goals and references")
    p.add_argument("--all", action="store_true", help="every benchmark, in the order --list gives")
    p.add_argument("--ledger", type=Path, default=_ledger.LEDGER, help="the ledger to append to")
    p.add_argument("--no-ledger", action="store_true", help="print the figures only")
    return p


def bench_parser(name: str, mod) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"run.py {name}", description=f"{mod.GOAL} Reference: {mod.REFERENCE}.")
    p.add_argument("--data", type=Path, default=None, metavar="FEATS", help="prepared features")
    mod.arguments(p)
    return p


def tiny_features(root: Path) -> Path:
    """The test suite's tiny corpus (tests/conftest.py: 0.03 h, seed 3), synthesized and prepared."""
    from speechperf.corpus.synth import synthesize

    synthesize(root / "corpus", hours=0.03, seed=3, progress=False)
    subprocess.run([sys.executable, "-m", "speechperf", "prepare", "--workers", "1", str(root / "corpus"),
                    str(root / "feats")], check=True, stdout=subprocess.DEVNULL)
    return root / "feats"


def placeholders(options: list[str]) -> list[str]:
    """The options as the ledger keeps them: the features folder named FEATS, not its path on this machine."""
    out = list(options)
    for i, x in enumerate(out):
        if x.startswith("--data="):
            out[i] = "--data=FEATS"
        elif x == "--data" and i + 1 < len(out):
            out[i + 1] = "FEATS"
    return out


def listing() -> str:
    rows = []
    for name, module in SUITE.items():
        mod = importlib.import_module(module)
        rows.append(f"{name}\n  goal: {mod.GOAL}\n  ratio: {mod.RATIO}, against {mod.REFERENCE}")
    return "\n".join(rows)


def run_one(name: str, options: list[str], a, work: Path, machine: dict) -> dict:
    """One benchmark: its options parsed, features made where it needs them and has none, its
    figures measured, its ratio printed and its ledger line appended (``machine`` filled once,
    after the first measurement: its probes stay off the benchmarks' timed calls)."""
    mod = importlib.import_module(SUITE[name])
    b = bench_parser(name, mod).parse_intermixed_args(options)
    if mod.DATA and b.data is None:
        b.data = work / "feats" if (work / "feats").is_dir() else tiny_features(work)
    print(f"== {name}: {mod.GOAL}", flush=True)
    figures = mod.run(b)
    ratio = "n/a" if figures["ratio"] is None else f"{figures['ratio']:.3f}"  # a measurement without one
    print(f"{name}: {mod.RATIO} = {ratio} (reference: {mod.REFERENCE})", flush=True)
    if not a.no_ledger:
        if not machine:
            machine.update(_timing.machine())
        command = shlex.join(["python", "benchmarks/run.py", name, *placeholders(options)])
        _ledger.append(_ledger.entry(SUITE[name], command, {**figures, "versions": machine}, machine["name"]), a.ledger)
    return figures


def main(argv: list[str] | None = None) -> int:
    head, rest = split(sys.argv[1:] if argv is None else argv)
    p = runner_parser()
    a = p.parse_args(head)
    if a.list:
        print(listing())
        return 0
    names = list(SUITE) if a.all else a.names
    if not names and rest and not rest[0].startswith("-"):
        p.error(f"invalid choice: {rest[0]!r} (choose from {', '.join(SUITE)})")
    if not names:
        p.error("name a benchmark (--list names them) or give --all")
    data_only = rest == [] or (len(rest) == 2 and rest[0] == "--data") or (len(rest) == 1 and rest[0].startswith("--data="))
    if len(names) > 1 and not data_only:
        p.error("options after several names: only --data FEATS (one benchmark takes its own)")
    machine: dict = {}
    status = 0
    with tempfile.TemporaryDirectory(prefix="speechperf-bench-") as tmp:
        for name in names:  # one that refuses (bad input, no GPU for a GPU's goal) leaves the others to run
            try:
                run_one(name, rest, a, Path(tmp), machine)
            except SpeechperfError as e:
                print(f"run.py {name}: {e}", file=sys.stderr)
                status = max(status, e.exit_code)
    return status


if __name__ == "__main__":
    sys.exit(main())
