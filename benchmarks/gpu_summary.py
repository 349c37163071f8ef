"""The GPU check's one table (benchmarks/gpu_check.sh): figures per step from its logs and runs.

Reads LOGS/NAME.log as gpu_check.sh writes them (each ends in "exit RC after Ns (timeout
Ts)" or says "skipped"): env (torch, GPU, commit), demo_tta, conformer_tta and readers_tta
(`tta --json` rows), profile (`benchmarks/run.py step_profile`'s phase table per preset: host syncs,
device busy share, kernels, the top sync site), feed_* (`bench feed --json`), floor_*
(`benchmarks/run.py step_floor`; the compiled one's timeout reads as compilation that did not
finish), scale (`bench scale --json`), fp8, tests_* (pytest's last line), checksum (the tiny corpus's features checksum); and, with --runs, the run folders of the demo, the conformer and the gpu preset
with 2 readers (steps: utterances and seconds per step; evaluation seconds against
the training clock; how busy the GPU was over the TTA window, inside training phases and
inside evaluations; the step MFU from the iteration rows, for a run cut before its summary
too). A step that failed or is missing reads as such in its row, never as a figure.

Usage: python benchmarks/gpu_summary.py LOGS [--runs WORK] [--out summary.md] [--budget S] [--elapsed S]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from speechperf.hardware.measured_peak import recorded_peak
from speechperf.hardware.mfu import steps_achieved
from speechperf.errors import SpeechperfError
from speechperf.config.training import target_rule
from speechperf.results.view import RunView
from speechperf.scoring.target_rule import tta_minutes
from speechperf.studies.tta import time_columns

STEPS = ["demo", "demo_tta", "profile", "tests_cuda", "checksum", "conformer", "conformer_tta",
         "feed_gpu", "floor", "floor_graphs", "graphs", "graphs_tta", "feed_conformer", "feed_tiny", "tests_gpu_files",
         "readers", "readers_tta", "floor_conformer", "floor_doubled", "scale", "fp8", "fp8_rnnt",
         "conformer_fp8", "conformer_fp8_tta", "floor_conformer_compile"]
EXIT = re.compile(r"exit (-?\d+)(?: after (\d+)s)?")


def read(logs: Path, name: str) -> str | None:
    path = logs / f"{name}.log"
    return path.read_text(errors="replace") if path.is_file() else None


def status(text: str | None) -> str:
    """ok / exit RC (timeout) / skipped / missing, with the seconds taken."""
    if text is None:
        return "missing"
    if text.startswith("skipped"):
        return "skipped (budget)"
    m = None
    for m in EXIT.finditer(text):
        pass
    if m is None:
        return "no exit line"
    rc, secs = int(m.group(1)), m.group(2)
    word = "ok" if rc == 0 else ("timed out" if rc in (124, 137) else f"exit {rc}")
    return f"{word}, {secs} s" if secs else word


def json_in(text: str | None):
    """The first JSON array or object in a log (the command's --json output), or None."""
    if not text:
        return None
    for start in (i for i, c in enumerate(text) if c in "[{"):
        try:
            return json.JSONDecoder().raw_decode(text[start:])[0]
        except ValueError:
            continue
    return None


def fmt(x, digits: int = 3) -> str:
    if x is None:
        return "NA"
    if isinstance(x, float):
        return f"{x:,.{digits}g}" if abs(x) < 1000 else f"{x:,.0f}"
    return str(x)


def tta_figures(rows) -> str:
    """The first `tta --json` row's TTA, epochs, MFU, and whatever energy, evaluation and
    breakdown columns the row carries."""
    rows = rows.get("runs") if isinstance(rows, dict) else rows  # tta --json: {"runs": [...], "groups": ...}
    if not isinstance(rows, list) or not rows:
        return "no TTA rows"
    r = rows[0]  # the first target (the paper's CER 10)
    parts = [f"{r.get('metric', '?')} {fmt(r.get('target'))}: TTA {fmt(r.get('minutes'))} min "
             f"({r.get('state', '?')}), epoch {fmt(r.get('epochs to target'))}",
             f"MFU {fmt(r.get('MFU %'))} %, {fmt(r.get('TFLOPS'))} TFLOPS",
             f"energy to accuracy {fmt(r.get('energy to accuracy kWh'))} kWh"]
    parts += [f"{k} {fmt(v)}" for k, v in r.items() if k not in ("energy to accuracy kWh", "step floor")
              and re.search(r"energy|eval|breakdown|wait|share|floor", k, re.I)
              and v is not None]
    return "; ".join(parts)


def feed_figures(rows) -> str:
    if not isinstance(rows, list) or not rows:
        return "no output"
    r = rows[0]
    src = "recorded" if str(r.get("appetite source", "")).startswith("appetite from recorded") else "measured"
    return (f"appetite {fmt(r.get('appetite audio s/s'))} audio s/s ({src}, spread {fmt(r.get('appetite spread %'))} %), "
            f"supply {fmt(r.get('supply audio s/s per reader'))} per reader: {r.get('readers per GPU')} readers per GPU; "
            f"{r.get('host cores')} cores feed {fmt(r.get('GPUs this host feeds'))} GPUs")


def floor_figures(text: str | None) -> str:
    if not text:
        return "no output"
    floor = re.search(r"floor \(batches on the device\)\s+([\d.]+)\s+([\d.]+)", text)
    loop = re.search(r"loop \(loader, copies, reads\)\s+([\d.]+)\s+([\d.]+)", text)
    ratio = re.search(r"loop / floor = ([\d.]+)", text)
    batch = re.search(r"batch (\d+ utt \([^)]*\)|\d+ \(\w+\))", text)  # the mean utterances and the bound; older logs: batch_size
    if not (floor and loop and ratio):
        return "no floor table"
    return (f"floor {floor.group(1)} s/step ({floor.group(2)} utt/s), loop {loop.group(1)} s ({loop.group(2)} utt/s), "
            f"loop/floor {ratio.group(1)}" + (f"; batch {batch.group(1)}" if batch else ""))


def compile_figures(text: str | None) -> str:
    """The compiled floor's table, or how long compilation ran before the step's timeout cut it."""
    cut = re.search(r"exit (?:124|137) after (\d+)s", text or "")
    return f"compile did not finish in {cut.group(1)} s" if cut else floor_figures(text)


def fp8_figures(text: str | None) -> str:
    """benchmarks/run.py fp8's medians and ratio (fp8 / bf16 throughput, with its verdict or why not run)."""
    steps = dict(re.findall(r"^\s+(bf16|fp8): median step ([\d.]+) s", text or "", re.M))
    ratio = re.search(r"^fp8/bf16 throughput: ([\d.]+) .*; (.*)$", text or "", re.M)
    if not ratio:
        why = re.search(r"^fp8 does not run here: (.*)$", text or "", re.M)
        return f"not run: {why.group(1)}" if why else "no fp8 figures"
    return (f"bf16 {steps.get('bf16', '?')} s/step, fp8 {steps.get('fp8', '?')} s/step: fp8/bf16 throughput "
            f"{ratio.group(1)} ({ratio.group(2)})")


def scale_figures(rows) -> str:
    """`bench scale --json`'s rows: per workload its rate, MFU, GPU busy and peak beside the estimate."""
    if not isinstance(rows, list) or not rows:
        return "no output"
    return " // ".join(_scale_row(r) for r in rows)


def _scale_row(r: dict) -> str:
    name = f"{r.get('workload')} {r.get('precision')} x{r.get('world')}, {fmt(r.get('batch_s'))} s batches"
    if r.get("status") != "ok":
        return f"{name}: {r.get('status')}"
    return (f"{name}: {fmt(r.get('audio_s_per_s'))} audio s/s, {fmt(r.get('step_s'))} s/step, MFU "
            f"{fmt(r.get('mfu_pct'))} %, GPU busy {fmt(r.get('gpu_busy_pct'))} %, peak {fmt(r.get('peak_gb'))} GB "
            f"(estimate {fmt(r.get('estimate_gb'))} GB, estimate/peak {fmt(r.get('estimate_ratio'))})")


PRESET = re.compile(r"^== preset (\S+?): ", re.M)


def profile_figures(text: str | None) -> str:
    """Per preset and phase of the step_profile benchmark's output: host syncs, the device's busy share,
    kernels, the top sync site and the wall against the host's time in aten ops (per training step,
    per evaluation pass)."""
    starts = list(PRESET.finditer(text or ""))
    parts = []
    for m, nxt in zip(starts, [*starts[1:], None]):
        rows = phase_rows(text[m.end():nxt.start() if nxt else len(text)])
        if rows:
            parts.append(f"{m.group(1)}: " + "; ".join(phase_figures(r) for r in rows))
    return " // ".join(parts) or "no profile table"


def phase_rows(section: str) -> list[dict]:
    """The phase table's rows (columns: at least two spaces apart, as speechperf.tables aligns them)."""
    lines = section.splitlines()
    head = next((i for i, ln in enumerate(lines) if ln.strip().startswith("phase ")), None)
    if head is None:
        return []
    cols = re.split(r"\s{2,}", lines[head].strip())
    out = []
    for ln in lines[head + 2:]:
        cells = re.split(r"\s{2,}", ln.strip())
        if len(cells) != len(cols):
            break
        out.append(dict(zip(cols, cells)))
    return out


def phase_figures(r: dict) -> str:
    per = "step" if r["phase"].endswith("step") else "pass"
    wall = (f"{r['unprofiled ms']} ms a {per} ({r['profiled ms']} profiled, {r['host ops ms']} of it in host "
            f"aten ops)")
    if r.get("syncs", "n/a") == "n/a":
        return f"{r['phase']}: {wall} (device columns n/a)"
    return (f"{r['phase']}: {r['syncs']} syncs a {per} (top {r['top sync site']}), GPU busy {r['busy %']} %, "
            f"{r['kernels']} kernels; {wall}")


def pytest_figures(text: str | None) -> str:
    lines = [ln for ln in (text or "").splitlines() if re.search(r"\d+ (passed|failed|errors?|skipped|deselected)", ln)]
    return lines[-1].strip("= ") if lines else "no pytest summary"


def run_figures(run: Path) -> str:
    """From a run folder's records: steps (mean utterances, seconds), evaluation seconds against
    the training clock, how busy the GPU was over the TTA window (to CER 10, or to the last
    evaluation where the run never reached it), inside its training phases and inside its
    evaluations (studies/busy.py, as `tta --json` shows it), how its evaluations decoded where
    the run recorded it (threads, rate, the share of a core they had), and the step MFU over its iteration
    rows (hardware/mfu.py, against the peak its summary holds or, for a run stopped before it wrote
    one, the recorded GPU's); and the garbage collector's pauses where its summary holds them."""
    if not (run / "results.db").is_file():
        return f"no {run / 'results.db'}"
    try:
        r = RunView.open(run)
    except SpeechperfError as e:  # a run cut while its folder was made: its row says so, the table goes on
        return f"unreadable run: {e}"
    try:
        iterations, evals, samples, env = r.rows.iterations(), r.rows.evals(), r.rows.samples(), r.env
        summary, tc = r.summary() or {}, r.config.get("train", {})
    finally:
        r.close()
    parts = [f"{len(iterations)} steps of {fmt(mean(iterations, 'batch_size'))} utt, {fmt(mean(iterations, 'step_s'))} s/step"]
    clock = max((i["clock_s"] for i in iterations), default=None)
    ev = sum(e["eval_s"] for e in evals) if evals else None
    if ev is not None and clock:
        parts.append(f"per-epoch evaluation {fmt(ev)} s of the {fmt(clock)} s clock ({100 * ev / clock:.0f} %)")
    metric, target, window = target_rule(tc)  # the run's own stop rule (config.json)
    minutes = tta_minutes([(e["clock_s"], e[metric]) for e in evals], target, window) if target > 0 else None
    columns = time_columns(iterations, evals, minutes, samples, env.get("device"))
    parts.append(busy_figures(columns["busy"], minutes is not None))
    if columns["decode"]:
        parts.append(decode_figures(columns["decode"]))
    parts.append(mfu_figures(iterations, recorded_peak(summary, env, tc.get("system", {}).get("precision", "fp32"))))
    if summary.get("cuda_graphs"):  # train.system.cuda_graphs: the shapes captured before the clock, steps run eagerly
        g = summary["cuda_graphs"]
        parts.append(f"CUDA graphs: {g['shapes']} shapes captured ({g.get('eval shapes', 0)} evaluation shapes) in "
                     f"{fmt(g['capture s'])} s, {g['eager steps']} steps of unplanned shapes run eagerly")
    if summary.get("sampled_gpus"):  # which GPUs its power and busy share are of (telemetry/device_gpus.py)
        g = summary["sampled_gpus"]
        parts.append(f"sampled {', '.join(g['sources']) or 'no GPU'}" + (f" ({g['selection']})" if g["selection"] else ""))
    if summary.get("gc"):  # the interpreter's collection pauses while it trained (telemetry/gc_pauses.py)
        g = summary["gc"]
        parts.append(f"garbage collections {g['collections']} ({fmt(g['seconds'])} s), {g['full collections']} full "
                     f"({fmt(g['full seconds'])} s, longest {fmt(g['longest full s'])} s)")
    return "; ".join(parts)


def decode_figures(d: dict) -> str:
    """The evaluations' decodes (studies/time_parts.py's ``decoding``): threads, rate, core share."""
    return (f"decode {d['threads']} threads, {fmt(d['frames per thread-s'])} frames/s per thread-second, "
            f"{fmt(d['core share %'])} % of a core each")


def mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return sum(values) / len(values) if values else None


def busy_figures(b: dict | None, reached: bool) -> str:
    """``GPU busy 37 % of the TTA (581 samples), 44 % in training (439), 19 % in evaluations (118)``."""
    if b is None:
        return "busy: no evaluation to end its window"
    if b["device"] is None:
        return f"busy: {b['note']}"
    span = "of the TTA" if reached else "to the last evaluation (target not reached)"
    pct = lambda x: "NA" if x is None else f"{x:.0f} %"  # noqa: E731
    return (f"{b['device']} busy {pct(b['tta %'])} {span} ({b['tta samples']} samples), {pct(b['training %'])} in "
            f"training ({b['training samples']}), {pct(b['eval %'])} in evaluations ({b['eval samples']})"
            + (f" [{b['note']}]" if b["note"] else ""))


def mfu_figures(iterations: list[dict], peak) -> str:
    """``step MFU 3.92 % (38.8 TFLOPS of 989.5; PEAK SOURCE)`` over the rows with model FLOPs."""
    achieved = steps_achieved(iterations, peak.tflops)
    if not achieved["model_flops_steps"]:
        return "step MFU NA (no iteration row holds model FLOPs)"
    return (f"step MFU {fmt(achieved['mfu_pct'])} % ({fmt(achieved['tflops'])} TFLOPS of {fmt(peak.tflops, 4)}; "
            f"{peak.source})")


def env_figures(text: str | None) -> dict:
    text = text or ""
    torch = re.search(r"^torch (\S+) cuda (\S+) cudnn (\S+) gpu (.+?) python (\S+)$", text, re.M)
    commit = re.search(r"^commit (\S+)", text, re.M)
    cpu = re.search(r"Model name:\s+(.+)", text)
    date = re.search(r"^date (.+)$", text, re.M)
    autocast = re.search(r"^autocast bf16: (.+)$", text, re.M)  # gpu_check.sh's probe: the LSTM's dtype
    return {"autocast": autocast.group(1) if autocast else None, "torch": torch.group(1) if torch else "?", "device": torch.group(4) if torch else "?",
            "cuda": torch.group(2) if torch else "?", "commit": commit.group(1) if commit else "?",
            "cpu": cpu.group(1).strip() if cpu else "?", "date": date.group(1) if date else "?"}


def rows(logs: Path, runs: Path | None) -> list[tuple[str, str, str]]:
    """(step, status, figures) per step that ran or was expected."""
    out = []
    for name in STEPS:
        text = read(logs, name)
        if text is None and name in ("feed_tiny", "feed_gpu", "feed_conformer", "floor_conformer_compile", "graphs", "graphs_tta"):
            continue  # steps that only one of the GPU and the --cpu flows runs
        if name in ("demo_tta", "conformer_tta", "readers_tta", "graphs_tta", "conformer_fp8_tta"):
            figs = tta_figures(json_in(text))
        elif name in ("demo", "conformer", "readers", "graphs", "conformer_fp8"):
            run = runs / ("demo/run" if name == "demo" else name) if runs else None
            figs = run_figures(run) if run else "no --runs"
        elif name.startswith("feed_"):
            figs = feed_figures(json_in(text))
        elif name == "profile":
            figs = profile_figures(text)
        elif name == "floor_conformer_compile":
            figs = compile_figures(text)
        elif name.startswith("fp8"):
            figs = fp8_figures(text)
        elif name == "scale":
            figs = scale_figures(json_in(text))
        elif name == "floor" or name.startswith("floor_"):
            figs = floor_figures(text)
        elif name.startswith("tests_"):
            figs = pytest_figures(text)
        else:
            got = json_in(text)
            figs = f"features_sha256 {got['features_sha256']} ({got['cap']} cap)" if isinstance(got, dict) else "no checksum"
        out.append((name, status(text), figs))
    return out


def table(logs: Path, runs: Path | None, budget: int | None, elapsed: int | None) -> str:
    env = env_figures(read(logs, "env"))
    head = (f"# GPU check: {env['device']} on {env['cpu']}, torch {env['torch']} (CUDA {env['cuda']}), "
            f"commit {env['commit']}, {env['date']}" + (f"; {elapsed} s of a {budget} s budget" if elapsed is not None else ""))
    if env["autocast"]:
        head += f"\n\nUnder bf16 autocast: {env['autocast']}."
    body = ["| step | status | figures |", "| --- | --- | --- |"]
    body += [f"| {n} | {s} | {f.replace('|', '/')} |" for n, s, f in rows(logs, runs)]
    return "\n".join([head, "", *body]) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", type=Path, help="the folder of NAME.log files gpu_check.sh wrote")
    ap.add_argument("--runs", type=Path, default=None, help="gpu_check.sh's work folder (demo/run, conformer)")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here (markdown)")
    ap.add_argument("--budget", type=int, default=None)
    ap.add_argument("--elapsed", type=int, default=None)
    a = ap.parse_args(argv)
    if not a.logs.is_dir():
        print(f"gpu_summary: {a.logs} is not a folder of logs", file=sys.stderr)
        return 2
    text = table(a.logs, a.runs, a.budget, a.elapsed)
    if a.out:
        a.out.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
