"""The report's sections about training runs: the papers' figures and tables, platforms,
prices, power and energy, and sentences logged during training (registered in order)."""
from __future__ import annotations

import re
import statistics

from speechperf import metric
from speechperf.hardware.mfu import mfu_columns
from speechperf.studies.report import figures
from speechperf.studies.report.comparison import energy_by_source, price_rows, time_rows, tta_rows
from speechperf.studies.report.runs import who
from speechperf.studies.report.sections import Context, Figure, Note, Section, Table, register_section
from speechperf.results.workload import by_workload
from speechperf.hardware.platforms import of_run, presets, table
from speechperf.studies.aggregate import speed_notes
from speechperf.studies.precisions import choice_words, each_at_best, label as precision_label, precision
from speechperf.studies.study import seed_runs_table


def _figure(ctx: Context, draw, name: str, caption: str) -> Figure:
    path, why = draw(ctx.runs, ctx.out / name)
    return Figure(name, path, why, caption)


@register_section("fig7", 10)
def loss_accuracy_section(ctx: Context) -> Section:
    return Section("Loss and accuracy over time (Fig. 7)", [_figure(
        ctx, lambda runs, path: figures.loss_and_accuracy(runs, path, ctx.targets), "fig7.png",
        "Training loss per batch smoothed with a Gaussian (sigma 10 batches); each validation metric the runs hold "
        "(CER, WER, ...) after each epoch, shaded: their 95% bootstrap interval over the validation utterances; "
        "dotted lines: the TTA targets. Log y axes; x is the TTA clock: time since initialization ended, "
        "evaluations included, time the process was down (before a resume) excluded.")])


def _metric_cells(shown: list, row: dict) -> dict:
    """A table row's metric columns (speechperf/metric.py): each metric's value and its interval's ends."""
    cells = {}
    for m in shown:
        cells[m.header] = row.get(m.name)
        if m.interval:
            cells[f"{m.label} 95% low"], cells[f"{m.label} 95% high"] = row.get(f"{m.name}_lo"), row.get(f"{m.name}_hi")
    return cells


@register_section("validation", 15)
def validation_section(ctx: Context) -> Section:
    shown = metric.held([e for r in ctx.runs for e in r["evals"]], metric.per_epoch())
    rows = [{**who(r), "epoch": e["epoch"], "clock min": e["clock_s"] / 60, "split": e["split"],
             **_metric_cells(shown, e), "utterances": e["n_utts"]} for r in ctx.runs for e in r["evals"]]
    return Section("Validation after every epoch, with its resolution", [
        Note("95% low/high: a percentile bootstrap over the validation utterances (1000 resamples of the split, "
             f"corpus-level {' and '.join(m.label for m in shown if m.interval) or 'error rates'} recomputed on "
             "each, fixed draws): how finely this split measures the error. "
             "Epochs whose intervals overlap are not told apart by this split, and a target crossed inside the "
             "interval is crossed by the split's resolution as much as by the model. It says nothing of the spread "
             "between seeds (see 'Repeated runs'). Empty low/high: a row recorded before speechperf kept them; "
             "an empty metric: a run recorded before speechperf measured it (not measured, not 0)."),
        Table("validation.csv", rows, "no per-epoch validation recorded")])


@register_section("fig8", 20)
def utilization_section(ctx: Context) -> Section:
    blocks = [_figure(ctx, figures.utilization_window, "fig8.png",
                      "25 s from the middle of each run: CPU of the training process and its loader workers "
                      "(solid, % of the whole machine: the average over all its cores, as the paper; runs "
                      "recorded before that unit show % of one core, labelled), each GPU dashed. The title "
                      "gives each series' achieved sampling period (median interval) and sample count.")]
    no_gpu = [r["label"] for r in ctx.runs if not r["env"].get("gpus")]
    if no_gpu:
        blocks.append(Note(f"No GPU in: {', '.join(no_gpu)} (CPU only)."))
    return Section("Utilization (Fig. 8)", blocks)


@register_section("fig9", 30)
def throughput_section(ctx: Context) -> Section:
    return Section("Throughput over time (Fig. 9/10)", [_figure(
        ctx, figures.throughput, "fig9.png",
        "Utterances and audio seconds processed per second: thin, each batch on its own; bold, a moving average "
        "over clock time. Orange bands: evaluations, where training stands still, so the average dips there.")])


@register_section("power", 40)
def power_section(ctx: Context) -> Section:
    energy = []
    for r in ctx.runs:
        end = max((s["t"] for s in r["samples"]), default=0.0)
        for source, (joules, method) in energy_by_source(r, end).items():
            energy.append({**who(r), "source": source, "method": method, "seconds": end, "energy J": joules,
                           "kWh": joules / 3.6e6, "mean W": joules / end if end else None})
    missing = [{**who(r), "source": src, "why": why} for r in ctx.runs
               for src, why in sorted(r["env"].get("telemetry", {}).get("unavailable", {}).items())]
    not_recorded = [r["label"] for r in ctx.runs if "telemetry" not in r["env"]]
    blocks = [_figure(ctx, figures.power_over_time, "power.png",
                      "GPU power from NVML or, on AMD GPUs, amdsmi (dashed; instant reading where the driver "
                      "has it, else its averaged reading), CPU package and DRAM from RAPL energy counters (solid)."),
              Table("energy.csv", energy, "no run measured power or energy (no NVML or amdsmi GPU, no readable RAPL "
                                          "counter); "
                                          "nothing is estimated from TDP"),
              Table("unavailable.csv", missing) if missing else Note("Every power source was available.")]
    if not_recorded:
        blocks.append(Note(f"Runs that did not record which sources were available: {', '.join(not_recorded)}."))
    return Section("Power and energy", blocks)


@register_section("tta", 50)
def tta_section(ctx: Context) -> Section:
    groups = by_workload(ctx.runs, lambda r: r["workload"])
    blocks = [Note(f"TTA: minutes from the end of initialization until the median validation error of the last 3 "
                   f"epochs reaches the target (empty: never reached); targets: {ctx.targets}. Relative %: TTA "
                   "against the run named in 'reference' - the run on the cheapest platform that reached the target, "
                   "or the fastest when no platform has a price - among the runs of the same workload only. "
                   "'shared': 'yes N%' where other processes took CPU cores the run needed in N% (5% or more) of "
                   "its clock up to that TTA (telemetry/contention.py): such a TTA measured the neighbour too.")]
    if len(groups) > 1:
        blocks.append(Note(f"These runs train {len(groups)} different workloads ({'; '.join(groups)}): a different "
                           "model is a different job (its own computation per step and its own route to the "
                           "target), so its time to accuracy is not ranked against another's; one table per workload."))
    for k, (name, runs) in enumerate(groups.items()):
        if len(groups) > 1:
            blocks.append(Note(f"Workload {name}: {', '.join(r['label'] for r in runs)}."))
        best = each_at_best(precision(r["config"]) for r in runs)  # None: one precision, like for like
        if best:
            blocks.append(Note(f"Workload {name}: its runs trained in different precisions; 'relative %' compares "
                               f"them {best}."))
        blocks.append(Table("tta.csv" if len(groups) == 1 else f"tta_{k + 1}_{_slug(name)}.csv",
                            tta_rows(runs, ctx.targets), f"the targets ({ctx.targets}) have none for {name}"))
    for m in metric.per_epoch():  # a run recorded before a metric existed has no TTA of it (no row), said here
        older = [r["label"] for r in ctx.runs if r["evals"] and ctx.targets.of(m.name, r["workload"]["model"])
                 and not metric.measured(r["evals"], m.name)]
        if older:
            blocks.append(Note(f"No {m.label} TTA rows for {', '.join(older)}: recorded before speechperf measured "
                               f"{m.label} (not measured; neither 0 nor a target never reached)."))
    return Section("Time to accuracy (Table 4/6), per workload", blocks)


@register_section("time_parts", 55)
def time_parts_section(ctx: Context) -> Section:
    rows = time_rows(ctx.runs)
    path, why = figures.time_parts(rows, ctx.out / "time_parts.png")
    return Section("Where the time to accuracy went", [
        Note("Seconds of the TTA clock up to CER 10 (or the run's last evaluation where it never reached it), from "
             "the run's own rows: training steps (the step's compute, its reads and logging), waiting for the "
             "loader's next batch, evaluation (split into forward, decode and score where the run recorded them), "
             "checkpoints, and epoch changes (the clock between the rows: loader start, the model made common). "
             "An accelerator-bound TTA is mostly steps; data and evaluation are the host's. 'note' says where a "
             "part was not recorded, or where the parts do not add up to the TTA within 1%. Step vs its floor "
             "('loop/floor'): where the run measured it after training (train.floor.steps), the loop's steps over the "
             "same steps replayed on batches already on the device, no loader or logging beside them (1.00: the loop "
             "costs what the hardware costs), over a sample of steps spread across the run's epochs: the median "
             "with its 10th and 90th percentiles ('loop/floor p10', 'p90'); 'step vs floor' names the sampled "
             "steps far above the median. 'shared': whether other processes took CPU cores the run needed in at "
             "least 5% of that time ('yes' with the share; telemetry/contention.py): then its steps and TTA "
             "describe the neighbour too. In each bar's label, how busy the "
             "accelerator was (studies/busy.py): the mean of its recorded utilization samples over that time, inside "
             "its training phases (an epoch's first step to its evaluation) and inside its evaluations, with the "
             "sample count; a GPU's is NVML's utilization (a kernel running) or amdsmi's gfx_activity, "
             "a CPU run's the CPU seconds of its "
             "processes in % of the machine's cores. The table's 'decode' columns: the evaluations' decode "
             "threads, their rate (valid frames per thread-second inside the decoder) and the share of a core each "
             "had (under 100%: they waited for cores or the GIL; empty for runs that did not record it)."),
        Figure("time_parts.png", path, why, "A stacked bar per run: the parts of its time to accuracy, in seconds, "
               "and the accelerator's busy share in its label."),
        Table("time_parts.csv", rows, "no run has evaluations to break its time down to")])


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


@register_section("beam_sweep", 60)
def beam_sweep_section(ctx: Context) -> Section:
    shown = metric.held([w for r in ctx.runs for w in r["sweep"]])
    rows = [{**who(r), "split": w["split"], "decoder": w["decoder"], "beam": w["beam"], "eval s": w["eval_s"],
             **_metric_cells(shown, w), "utterances": w["n_utts"]} for r in ctx.runs for w in r["sweep"]]
    return Section("Beam width vs evaluation time and accuracy (Table 3)", [
        Table("beam_sweep.csv", rows, "no beam sweep was run for these runs (speechperf beam-sweep RUN)")])


@register_section("final", 70)
def final_section(ctx: Context) -> Section:
    shown = metric.held([f for r in ctx.runs for f in r["finals"]])
    rows = [{**who(r), "split": f["split"], "decoder": f["decoder"], "beam": f["beam"], **_metric_cells(shown, f),
             "utterances": f["n_utts"]} for r in ctx.runs for f in r["finals"]]
    return Section("Final evaluation (Table 5)", [
        Note("".join(f"{m.label}: {m.meaning}; " for m in shown) + "95% low/high: the bootstrap interval over the "
             "split's utterances (as in the per-epoch validation table)."),
        Table("final.csv", rows, "no run has a final evaluation (it runs when training ends)")])


@register_section("runs", 80)
def runs_section(ctx: Context) -> Section:
    rows = []
    for r in ctx.runs:
        env, gpus = r["env"], r["env"].get("gpus") or []
        rows.append({**who(r), "folder": r["run"], "status": r["row"].get("status"),
                     "preset": r["config"].get("preset") or r["row"].get("preset"),
                     "precision": precision_label(r["config"], env),
                     "precision choice": choice_words(env.get("precision_choice")),
                     "precision note": r["env"].get("precision_note"), "seed": r["row"].get("seed"),
                     "processes": env.get("world_size"), "platform": of_run(env).name, "cpu": env.get("cpu_model"),
                     "cores": env.get("cpu_cores_logical"),
                     "gpu": ", ".join(dict.fromkeys(g.get("name", "?") for g in gpus)) or "none", "gpus": len(gpus),
                     "driver": ", ".join(dict.fromkeys(str(g.get("driver")) for g in gpus if g.get("driver"))) or None,
                     "cuda": env.get("cuda"), "torch": env.get("libraries", {}).get("torch"),
                     "host": env.get("hostname")})
    return Section("Runs and machines", [Table("runs.csv", rows)])


@register_section("throughput", 35)
def throughput_table_section(ctx: Context) -> Section:
    rows = []
    for r in ctx.runs:
        its = r["iterations"]
        if its:
            rows.append({**who(r), "iterations": len(its),
                         "median utterances/s": statistics.median(i["utts_per_s"] for i in its),
                         "median audio s/s": statistics.median(i["audio_s_per_s"] for i in its),
                         "mean batch": statistics.mean(i["batch_size"] for i in its),
                         "training clock min": its[-1]["clock_s"] / 60, **mfu_columns(r.get("summary") or {})})
    util = []
    for r in ctx.runs:
        by_series: dict[tuple[str, str], list[float]] = {}
        for s in r["samples"]:
            if s["metric"] in figures.UTIL_UNITS:
                by_series.setdefault((s["source"], s["metric"]), []).append(s["value"])
        for (source, name), values in sorted(by_series.items()):
            util.append({**who(r), "source": source, "metric": name, "samples": len(values),
                         "mean %": statistics.mean(values), "max %": max(values),
                         "unit": figures.util_unit(source, name)})
    return Section("Throughput and utilization side by side", [
        Note("TFLOPS: the model's training FLOPs (forward and backward over the valid frames; padding, the loss, "
             "the optimizer, data loading and evaluation not counted) per second of training steps; MFU: that in % "
             "of the peak named in 'peak source' (a GPU's dense datasheet peak for the run's precision, a CPU's "
             "measured GEMM peak)."),
        Table("throughput.csv", rows, "no training iterations recorded"),
        Table("utilization.csv", util, "no utilization samples recorded")])


@register_section("platforms", 90)
def platforms_section(ctx: Context) -> Section:
    seen = {p.name: p for p in presets()}
    for r in ctx.runs:
        p = of_run(r["env"])
        seen.setdefault(p.name, p)
    return Section("Platforms and prices (Table 1)", [Table("platforms.csv", table(list(seen.values())))])


@register_section("price", 100)
def price_section(ctx: Context) -> Section:
    return Section("Price/performance (TTA to CER 10)", [
        Note("TTA x price: minutes x purchase price ($ min, lower is better); cost to accuracy: TTA in hours x "
             "$/hour; energy to accuracy: counters (or integrated power) up to the TTA. The paper rows are LibriSpeech "
             "runs, a far larger job than the embedded corpus: compare platforms within one job only. Prices come "
             "from --price-per-hour, --platform-file, the platform named at training, or the profile the run's GPUs "
             "(or EC2 instance type) match, in that order; `speechperf platforms` lists every profile's prices with "
             "their date and source. 'price note' says why a column is empty."),
        Table("price.csv", price_rows(ctx.runs))])


@register_section("repeated", 110)
def repeated_section(ctx: Context) -> Section:
    runs, groups, comparisons = seed_runs_table(ctx.runs, ctx.targets)
    blocks = [Note("Groups: runs of one workload, configuration apart from train.seed, and machine. TTA = epochs to "
                   "target (the recipe's; their spread is the seeds') x minutes per epoch (the hardware's). A run that "
                   "never reached a target is a failed run (MLPerf): slower than any TTA in the median and the "
                   "interval, a dropped score in the olympic mean (MLPerf's result summarizer; one tolerated); "
                   "unfinished runs are counted apart. RCP check: epochs against the preset's reference convergence "
                   "points (mlperf-logging's RCP checker)."),
              Table("repeated.csv", groups, "no run has a TTA target of the metrics shown"),
              Table("seed_runs.csv", runs, "no run has a TTA target of the metrics shown")]
    blocks += [Note(line) for line in speed_notes(groups)]
    if comparisons:
        blocks += [Note("Between groups of one workload: median of the seed-pair TTA ratios A/B with an exact 95% "
                        "(Mann-Whitney) interval; an interval holding 1 says these seeds cannot tell the two apart."),
                   Table("comparisons.csv", comparisons)]
    else:
        blocks.append(Note("One group per workload: no two machines or configurations to compare."))
    return Section("Repeated runs (seeds): aggregates, the two factors of TTA, reference convergence", blocks)


@register_section("sentences", 400)
def sentences_section(ctx: Context) -> Section:
    rows = [{**who(r), "iteration": s.get("iteration"), "reference": p.get("ref"), "hypothesis": p.get("hyp")}
            for r in ctx.runs for s in r["sentences"] for p in s.get("pairs", [])[:1]]
    return Section("Sentences generated during training (greedy, last three)", [
        Table("sentences.csv", rows, "no sentences logged")])
