"""The record of a training run, between the loop and the run folder.

The loop trains; the recorder writes down what happened, in one place: where the run
stands (:class:`Progress`) and its TTA clock, the event log's lines (MLPerf's keys,
results/events.py), the iteration rows, the logged sentences, the evaluation rows, the
utilization samples, what surrounds a checkpoint (the trainer saves it:
results/checkpoint.py) and how the run ended (finished, with the check it was handed against
its preset's reference; or failed: one failure path for every way a run can stop early).
:class:`speechperf.results.run.Run` owns the folder's files (its rows: ``run.rows``; its logs:
``run.log``); the recorder decides what goes into them, and what the machine did meanwhile
through :class:`~speechperf.train.machine_record.MachineRecord`.

Rank 0 records (:class:`RunRecorder`); every other rank gets a :class:`Recorder`, which
keeps the progress and the clock (each rank needs its position and the time cap) and whose
recording methods do nothing, so that the loop has no branch per rank for recording.
"""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from speechperf import metric
from speechperf.objectives import objective_of
from speechperf.results.layout import EVENTS_FILE, SUMMARY_FILE
from speechperf.results.run import Run
from speechperf.results.checkpoint_writer import Written
from speechperf.results.events import C
from speechperf.train.faults import as_fault, failure_status
from speechperf.results.mlperf import log_submission
from speechperf.results.progress import Clock, Progress
from speechperf.results.schema import EVALS_DECODE, EVALS_PARTS
from speechperf.train.machine_record import MachineRecord
from speechperf.train.warmup import warn_if_slow
from speechperf.hardware.mfu import RunFlops
from speechperf.telemetry import contention
from speechperf.telemetry.device_gpus import RunGpu
from speechperf.telemetry.status import StatusLine
from speechperf.tables import print_lines

SENTENCE_PAIRS = 3  # hypothesis/reference pairs logged per sentence batch


class Recorder:
    """A rank's progress and TTA clock; records nothing (ranks other than 0)."""

    def __init__(self, prog: Progress, where):
        self.prog, self.where = prog, where  # what holds the run folder: the Run (rank 0), the admission (others)
        self.clock: Clock | None = None  # started by ``initialized`` (run_start)
        self.run_id: str | None = None
        self.data_s = 0.0  # seconds the last batch took to arrive from the loader (:meth:`batches`)

    def batches(self, loader):
        """The loader's batches, timing each wait for the next one (``data_s``: the step's
        waiting for data, apart from its compute in the iteration row)."""
        it = iter(loader)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            self.data_s = time.perf_counter() - t0
            yield batch

    @property
    def out(self) -> Path:
        """The run folder, as messages name it: read from the run (or admission) that holds it."""
        return self.where.folder

    def now(self) -> float:
        """TTA seconds so far (before run_start: where the run stood at its checkpoint)."""
        return self.clock.now() if self.clock is not None else self.prog.clock_s

    def initialized(self, plan: str, init_s: float, parts: dict, run_gpus: list[RunGpu] | None = None) -> None:
        """Initialization is over: the TTA clock starts, continuing a resumed run's; ``run_gpus``: the
        node's GPUs the run uses, which rank 0 samples (None: every GPU)."""
        self.prog.init_s += init_s
        self.clock = Clock(self.prog.clock_s)

    @contextmanager
    def off_clock(self):
        """Work that is no part of the time to accuracy (an evaluation's bootstrap intervals,
        after the stop rule has read the point values): the TTA clock stands still meanwhile."""
        stood = self.now()
        try:
            yield
        finally:
            if self.clock is not None:
                self.clock = Clock(stood)

    def summary(self, status: str) -> dict:
        return _summary(self.run_id, self.out, status, self.prog, self.now())

    def finish(self, status: str, graphs: dict | None = None) -> dict:  # noqa: ARG002 (rank 0 records them)
        """The run ended with ``status``: its summary row. ``graphs``: train.system.cuda_graphs' figures
        (train/graphs.py ``graph_figures``; None: the steps ran without CUDA graphs)."""
        return self.summary(status)

    def fail(self, e: BaseException, meter=None) -> BaseException:
        """The error to raise for ``e``: named as a machine fault where it is one (a full disk:
        exit 1), else ``e`` itself. Rank 0 records the failure first."""
        return as_fault(e, self.out) or e

    # ---- what only rank 0 records -----------------------------------------------------------
    def count_flops(self, cfg, device) -> dict:  # noqa: ARG002 (rank 0 counts: MFU is in its summary)
        return {}

    def epoch_started(self) -> None: ...
    def iteration_row(self, batch, step_s: float, comm: tuple[float, int] = (0.0, 0)) -> dict | None: ...
    def steps_read(self, reads: list) -> None: ...
    def sentences(self, batch, step, model) -> None: ...
    def epoch_ended(self) -> None: ...
    def eval_started(self) -> None: ...
    def evaluated(self, r: dict, final: bool) -> None: ...
    def stopped(self, status: str) -> None: ...


class RunRecorder(Recorder):
    """Rank 0's recorder: writes the run folder through ``run``."""

    def __init__(self, prog: Progress, run: Run, quiet: bool, target: str,
                 check: Callable[[Run, str], dict] | None = None, units=None):
        super().__init__(prog, run)

        self.run, self.run_id, self.quiet = run, run.run_id, quiet
        # check(run, status): the finished run against its reference (TrainRequest.check); None: none
        self.check = check
        self.target = target  # train.stop.target_metric: eval_accuracy's value and the status line's
        self.events = run.log.events()
        self.status_line = None if quiet else StatusLine(target)
        self.machine = MachineRecord(run.rows, run.run_id)  # utilization samples and collection pauses
        self.last_row: dict = {}
        self.flops = None  # RunFlops: the model's FLOPs per batch and the device's peak (MFU)
        self.units = units  # the run's output units: the logged sentences' ids into text (None: characters)
        self.ckpt_s = 0.0  # checkpoint seconds since the last iteration row: the next row's
        self.ckpt_writer = run.checkpoint_writer()  # each checkpoint written beside training (checkpoint_writer.py)
        self.resumed_at: int | None = None  # the iteration of the checkpoint a resumed run continues from
        self.floor: dict | None = None  # the step against its floor (train/floor.py), measured after training

    @classmethod
    def begin(cls, run: Run, plan: str, cfg, prog: Progress, *, world: int, splits: dict, init_ms: int,
              quiet: bool, batch: tuple[int, dict], check: Callable[[Run, str], dict] | None = None,
              units=None) -> "RunRecorder":
        """The recorder of ``run`` (made by ``Admission.begin`` as it planned), logging
        initialization's start once (MLPerf has no resume); ``units``: the run's output units."""
        rec = cls(prog, run, quiet, cfg.train.stop.target_metric, check, units)
        if plan != "resume":
            rec.events.start(C.INIT_START, time_ms=init_ms)
            log_run_config(rec.events, run.label, cfg, world, splits, batch)
        return rec

    def initialized(self, plan: str, init_s: float, parts: dict, run_gpus: list[RunGpu] | None = None) -> None:
        super().initialized(plan, init_s, parts)
        warn_if_slow(init_s, str(self.out))
        parts = {k: round(v, 3) for k, v in parts.items()}
        if plan == "resume":
            self.resumed_at = self.prog.iteration
            self.events.event("resume", clock_s=round(self.now(), 3), iteration=self.prog.iteration,
                              epoch=self.prog.epoch, init_s=round(init_s, 3), **parts)
        else:
            self.events.end(C.INIT_STOP, init_s=round(init_s, 3), **parts)
            self.events.start(C.RUN_START)
        self.machine.start(self.clock, run_gpus)

    def count_flops(self, cfg, device) -> dict:
        """The FLOP model and the device's peak, for MFU (initialization, outside the clock);
        returns its seconds as an initialization part."""
        self.flops = RunFlops.at_init(cfg, device)
        return {"flops_s": self.flops.init_s}

    # ---- training ---------------------------------------------------------------------------
    def epoch_started(self) -> None:
        if self.prog.start_batch == 0:  # a resumed epoch already logged its start
            self.events.start(C.EPOCH_START, epoch_num=self.prog.epoch)

    def iteration_row(self, batch, step_s: float, comm: tuple[float, int] = (0.0, 0)) -> dict:
        """The step's row (its loss filled in at the read); ``comm``: its communication (seconds, bytes)."""
        row = {**_iteration_row(self.run_id, self.prog, self.now(), None, batch, step_s, self.flops.row(batch)),
               "comm_s": comm[0], "comm_bytes": comm[1], "data_s": self.data_s, "ckpt_s": self.ckpt_s}
        self.data_s, self.ckpt_s = 0.0, 0.0
        return row

    def steps_read(self, reads: list) -> None:
        """Steps read from the device (train/step.py's StepMeter): their rows, the status line."""
        for r in reads:
            self.run.rows.add_iteration(r.row)
            self.last_row = r.row
        if self.status_line and reads:
            evals = self.prog.evals
            self.status_line.update(self.prog.epoch, reads[-1].iteration, reads[-1].loss, self.last_row["utts_per_s"],
                                    evals[-1].get(self.target) if evals else None, self.now(),
                                    self.last_row["audio_s_per_s"])

    def sentences(self, batch, step, model) -> None:
        """The batch's first utterances greedy-decoded (by the model's objective) beside their transcripts."""
        hyps = objective_of(model).texts(model, step.out, step.out_lens, SENTENCE_PAIRS, self.units)
        pairs = [{"ref": ref, "hyp": hyp} for ref, hyp in zip(batch.transcripts, hyps)]
        prog, loss = self.prog, self.last_row["loss"]
        self.run.log.append_sentences({"iteration": prog.iteration, "epoch": prog.epoch, "loss": loss, "pairs": pairs})
        self._say(f"iter {prog.iteration} epoch {prog.epoch} loss {loss:.3f}\n  ref: {pairs[0]['ref']}\n"
                  f"  hyp: {pairs[0]['hyp']}")

    def epoch_ended(self) -> None:
        if self.status_line:
            self.status_line.clear()
        self.events.end(C.EPOCH_STOP, epoch_num=self.prog.epoch)

    # ---- evaluation -------------------------------------------------------------------------
    def eval_started(self) -> None:
        self.events.start(C.EVAL_START, epoch_num=self.prog.epoch)

    def evaluated(self, r: dict, final: bool) -> None:
        """An evaluation's row: the epoch's validation (``final`` False: into the stopping
        rule's history too) or one split of the final evaluation, after the last epoch."""
        now, prog = self.now(), self.prog
        epoch = prog.epoch - 1 if final else prog.epoch
        self.run.rows.upsert("evals", {"run_id": self.run_id, "epoch": epoch, "split": r["split"],
                                       "decoder": r["decoder"], "beam": r["beam"], "clock_s": now,
                                       "eval_s": r["eval_s"], "loss": r["loss"],
                                       **{k: r.get(k) for k in (*EVALS_PARTS, *EVALS_DECODE)},
                                       "n_utts": r["n_utts"], "final": int(final),
                                       **{k: r.get(k) for k in metric.columns()}})  # every declared metric's columns
        if final:
            self.events.event("final_eval", r[self.target], split=r["split"], metric=self.target,
                              **_others(r, self.target), decoder=r["decoder"], beam=r["beam"])
            self._say(f"final {r['split']}: {_rates(r)} ({r['decoder']}, beam {r['beam']})")
            return
        prog.evals.append(metric.entry(now, r))  # the stop rule's history: {clock_s, metric: value}
        self.events.event(C.EVAL_ACCURACY, r[self.target], epoch_num=epoch, metric=self.target,
                          **_others(r, self.target), loss=round(r["loss"], 4), eval_s=round(r["eval_s"], 3))
        self.events.end(C.EVAL_STOP, epoch_num=epoch)
        self._say(f"epoch {epoch}: {r['split']} loss {r['loss']:.3f} {_rates(r)} "
                  f"eval {r['eval_s']:.1f}s clock {now / 60:.2f} min")

    # ---- checkpoint and end -----------------------------------------------------------------
    @contextmanager
    def checkpointing(self):
        """Around the trainer's save of the checkpoint (results/checkpoint.py), which it hands the
        yielded background writer (results/checkpoint_writer.py): before it, the previous write
        completed (its error raised here), the clock the checkpoint holds, its events.log line
        (logged before the save takes the logs' sizes, so a resume keeps it) and the samples so
        far; after it, its seconds for the next iteration row: what the loop waited (the previous
        write's end, the rows, the host copy of the state), not the write itself."""
        self.prog.clock_s = self.now()
        self._written(self.ckpt_writer.wait())
        self.events.event("checkpoint", iteration=self.prog.iteration, epoch=self.prog.epoch,
                          clock_s=round(self.prog.clock_s, 3))
        self.machine.store_so_far()  # a killed run keeps its samples up to here, all of them
        yield self.ckpt_writer
        self.ckpt_s += self.now() - self.prog.clock_s  # on the next iteration row (studies/time_parts.py)

    def stopped(self, status: str) -> None:
        """run_stop: the run trained to its end (``status``: success, time_cap, max_epochs), its
        last checkpoint written."""
        self._written(self.ckpt_writer.wait())
        self.events.end(C.RUN_STOP, None, status="success" if status == "success" else "aborted", reason=status)

    def finish(self, status: str, graphs: dict | None = None) -> dict:
        self.ckpt_writer.wait()  # written by stopped(); a finished run has its last checkpoint on disk
        self.machine.stop()
        summary = self.summary(status)
        summary["precision_note"] = self.run.env.get("precision_note")  # an emulated precision says so
        summary["precision_choice"] = self.run.env.get("precision_choice")  # auto: chosen, each candidate's step
        summary["gc"] = self.machine.gc_pauses.figures()  # the collection pauses while this process trained
        summary["sampled_gpus"] = self.machine.gpus  # which GPUs its power and busy share are of
        summary["floor"] = self.floor  # the step against its floor, where the run measured it (train/floor.py)
        # what others took of its cores (telemetry/contention.py)
        summary["shared"] = contention.shared(self.run.rows.samples(), self.run.env.get("torch_threads"),
                                              self.run.env.get("cpu_cores_logical"))
        summary["cuda_graphs"] = graphs  # shapes captured, seconds, steps run eagerly; None: no CUDA graphs
        summary.update(self.flops.summary(self.run.rows.iterations()))  # TFLOPS and MFU over every training step
        summary["convergence"] = self.check(self.run, status) if self.check is not None else None  # the preset's RCPs
        self.run.rows.set_status(status)
        self.run.write_summary(summary)  # last: its presence means the run finished
        self.run.close()
        return summary

    def fail(self, e: BaseException, meter=None) -> BaseException:
        """Record the run as stopped by ``e`` (faults.py: its status, the pending rows, a
        run_stop line, a summary that a ``failed`` status does not mark finished), as far
        as the machine lets it be written, and return the error to raise."""
        try:  # the steps since the last read, when the device still answers
            self.steps_read(meter.read() if meter is not None else [])
        except Exception:  # noqa: BLE001 (the original error is raised)
            pass
        fault = as_fault(e, self.out)
        reason, status = str(fault or e), failure_status(fault or e)
        unsaved = []
        for what, write in (("checkpoint", lambda: self._written(self.ckpt_writer.wait())),
                            ("rows", self.run.rows.flush), ("status", lambda: self.run.rows.set_status(status)),
                            (EVENTS_FILE, lambda: self.events.end(C.RUN_STOP, None, status="aborted", reason=reason)),
                            (SUMMARY_FILE, lambda: self.run.write_summary(self._stopped_summary(status))),
                            ("samples", self.machine.stop)):
            try:
                write()
            except Exception as err:  # noqa: BLE001 (a failed run reports its own cause, not this consequence)
                unsaved.append(f"{what}: {err}")
        try:
            self.run.close()
        except Exception:  # noqa: BLE001 (what could not be written is said above)
            pass
        if unsaved and fault is not None:
            fault = type(fault)(f"{fault} (not recorded: {'; '.join(unsaved)})")
        elif unsaved:  # an error that is no named fault keeps its type: what was lost is said beside it
            print(f"{self.out}: not recorded: {'; '.join(unsaved)}", file=sys.stderr, flush=True)
        return fault or e

    def _written(self, written: Written | None) -> None:
        """events.log's line for the last checkpoint's completed write, logged where the loop next
        waits for the writer: its seconds on the writer's thread, beside training (the loop's part
        is the next iteration row's ``ckpt_s``). That line of the checkpoint a run resumes from
        came after the checkpoint's log sizes and was cut with the rest: the resumed run logs it
        at the same place, without the seconds (the process before measured them), so that every
        checkpoint has its line once."""
        if written is not None:
            self.events.event("checkpoint_written", iteration=written.iteration, write_s=round(written.write_s, 3))
        elif self.resumed_at is not None:
            self.events.event("checkpoint_written", iteration=self.resumed_at, write_s=None)
        self.resumed_at = None

    def _stopped_summary(self, status: str) -> dict:
        """A failed or interrupted run's summary: its MFU over the steps it trained too (a run cut
        before its target, the GPU check's short conformer run, has no other)."""
        flops = self.flops.summary(self.run.rows.iterations()) if self.flops is not None else {}
        return {**self.summary(status), **flops, "gc": self.machine.gc_pauses.figures(),
                "sampled_gpus": self.machine.gpus}

    @contextmanager
    def off_clock(self):
        """As :meth:`Recorder.off_clock`; the span is kept, so that the samples taken in it are not
        stored and those after it are put on the TTA clock (``MachineRecord.on_clock``)."""
        start = time.perf_counter()
        with super().off_clock():
            yield
        self.machine.off_clock(start, time.perf_counter())

    def _say(self, text: str) -> None:
        """``text`` on stdout, each of its lines wrapped to a 100-column terminal (tables.WIDTH)."""
        if not self.quiet:
            if self.status_line:
                self.status_line.clear()
            print_lines(text.splitlines())
            sys.stdout.flush()


def _rates(r: dict) -> str:
    """``CER 9.36 [8.10, 10.70] WER ...``: every declared metric the evaluation holds, each with
    its 95% interval over the split's utterances (its resolution: a change inside it is within
    what the split can tell)."""
    return " ".join(f"{m.label} {m.text(r)}" for m in metric.held([r]))


def _others(r: dict, logged: str) -> dict:
    """An events.log line's metadata: every declared metric the evaluation holds but the one
    ``logged`` as the line's value, rounded to 3 decimals."""
    return {m.name: round(r[m.name], 3) for m in metric.held([r]) if m.name != logged}


def log_run_config(events, label: str, cfg, world: int, splits: dict, batch: tuple[int, dict]) -> None:
    """The submission keys and hyperparameters MLPerf's training rules ask for (results/mlperf.py),
    and the splits the run reads (verified). ``batch``: MLPerf's global batch size and its
    metadata, as the run's batching gives them (data/batching.py ``Batching.mlperf_batch``)."""
    log_submission(events, label)
    value, meta = batch
    events.event(C.GLOBAL_BATCH_SIZE, value, **meta)
    events.event(C.GRADIENT_ACCUMULATION_STEPS, 1)
    events.event(C.OPT_NAME, cfg.train.optim.name)
    events.event(C.OPT_BASE_LR, cfg.train.optim.lr)
    events.event(C.SEED, cfg.train.seed)
    events.event(C.TRAIN_SAMPLES, train_utterances(splits), splits=list(splits["train"]))
    events.event(C.EVAL_SAMPLES, splits["splits"][splits["valid"]]["utterances"], split=splits["valid"])
    events.event("world_size", world)
    events.event("preset", cfg.preset)
    events.event("data_splits", splits)


def train_utterances(splits: dict) -> int:
    """Utterances of the training splits, from ``verify_splits``' facts (data/check.py)."""
    return sum(splits["splits"][s]["utterances"] for s in splits["train"])


def _iteration_row(run_id, prog: Progress, clock_s: float, loss, batch, batch_s: float, model_flops: float) -> dict:
    b = len(batch.ids)
    return {"run_id": run_id, "iteration": prog.iteration, "epoch": prog.epoch, "clock_s": clock_s, "loss": loss,
            "batch_size": b, "frames": int(batch.feat_lens.sum()), "audio_s": float(batch.audio_seconds),
            "step_s": batch_s, "utts_per_s": b / batch_s, "audio_s_per_s": float(batch.audio_seconds) / batch_s,
            "model_flops": model_flops}


def _summary(run_id, out: Path, status: str, prog: Progress, clock_s: float) -> dict:
    last = prog.evals[-1] if prog.evals else {}
    return {"run": str(out), "run_id": run_id, "status": status, "epochs": len(prog.evals),
            "iterations": prog.iteration, "clock_min": clock_s / 60, "init_s": prog.init_s,
            **{f"last_{name}": last.get(name) for name in metric.targets()},  # the stop rule's metrics
            "skipped_steps": prog.skipped_steps, "impossible_utts": prog.impossible_utts}

