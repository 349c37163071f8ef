"""The training loop: the paper's state machine (docs/spec.md C), top to bottom.

training batch after batch; every ``sentence_every`` iterations greedy-decode the current
batch and log hypothesis vs reference; every ``checkpoint_every`` iterations an atomic
checkpoint; after every epoch evaluate the validation split (loss, WER, both CERs) with
the evaluation seconds recorded apart from training; stop at the target (median of the
last e epochs), the time cap or the last epoch; then a final evaluation of every
validation and test split. As in MLPerf, the TTA clock starts after initialization
(``init_start``..``init_stop``: every split verified, the model built, the decoder kernels
compiled, one warm-up step; see train/warmup.py), whose seconds are reported beside the
TTA; it only runs while this process runs, so a resumed run does not count the time it was
down. The run opened (configuration, process group, the folder's admission and lock, the Run,
the recorder): train/opening.py; what a process trains with: train/trainer.py; what happened:
the recorder (train/recorder.py) into the run folder (results/run.py); the checkpoint:
results/checkpoint.py. SIGINT and SIGTERM stop the run at the next read point, saved and
recorded (train/stop.py); the learning rate: train/schedule.py.

Data parallel: launched by torchrun (``WORLD_SIZE`` > 1) the algorithm of ``algo.name``
(speechperf/algorithms) trains: ``sync`` (the default) wraps the model in DDP; bsp, bmuf,
diloco, asgd and easgd let every rank train its own model and combine them after steps and
before evaluations; their hooks are one line each below (``algo.``). Each process's device and
backend: train/distributed.py; rank 0 alone writes files, evaluates and decides to stop.

Host synchronization: a step leaves its loss and skip flag on the device (train/step.py), read
together every ``train.system.sync_every`` steps and where needed (sentences, checkpoints, epoch end),
where the rows, status line, skip counters and divergence abort catch up in step order.
"""
from __future__ import annotations

import time

import torch

from speechperf.errors import SpeechperfError
from speechperf.scoring.target_rule import tta_minutes
from speechperf.train import floor
from speechperf.train.evaluate import evaluate, release_resident, with_intervals
from speechperf.train.faults import check_trained
from speechperf.train.graphs import graph_figures
from speechperf.train.opening import Opening, begin, opened
from speechperf.train.request import RESUME_MODES, TrainRequest
from speechperf.train.schedule import schedule_ended
from speechperf.train.step import TrainingDiverged, count_steps, read_point, train_step
from speechperf.train.stop import StopSignals, interrupted
from speechperf.train.trainer import Trainer, build, raise_as

__all__ = ["train", "TrainRequest", "TrainingDiverged", "RESUME_MODES"]


def train(request: TrainRequest) -> dict:
    """Train (or continue) the run ``request`` asks for; returns its summary row.

    Rank 0 alone looks at the run folder (train/opening.py, train/admission.py: fresh, restart,
    resume or finished, under its lock for the whole run; across machines only its disk holds it)
    and tells every rank what to do, or the error that stops them all. The same command, repeated
    by ``torchrun --max-restarts``, so recovers from a dead worker."""
    if not isinstance(request, TrainRequest):  # a typo'd call fails here, not deep in the loop
        raise TypeError(f"train takes one TrainRequest, not {type(request).__name__}")
    with opened(request) as o:  # configuration, process group, the folder admitted; released at its end
        return o.finished if o.plan == "finished" else _trained(o)


def _trained(o: Opening) -> dict:
    """The run opened as ``o``, built, begun and trained: rank 0's summary on every rank (one exit
    status). The trainer lives in this frame, which ends before the opening closes the process
    group (its DDP model holds the group: dropped after destroy_process_group, the group's
    destructor joined gloo's thread while holding the GIL that thread waited for: a hang)."""
    built = build(o.cfg, o.batching, o.group, o.features, o.ckpt)  # before the clock and the signals' handlers
    with StopSignals() as stop:  # the Run, its recorder, initialization (then the clock starts); the epochs
        return o.group.broadcast(_train(begin(o, built, stop)))


def _train(t: Trainer) -> dict:
    """The epochs, the checkpoint before the final evaluation, the final evaluation; the run's
    summary row (rank 0's; recorded as failed by whatever stopped it)."""
    rec, group, stop = t.rec, t.group, t.stop
    try:
        status = _epochs(t)
        t.release_data()  # loader.resident's buffer: the final evaluation's memory now
        evaluated = t.algo.before_eval(t.prog.start_batch)  # every rank: a stop inside an epoch synchronizes
        # saved before the final evaluation: a run stopped in it (or killed after it) continues from
        # here, its logs cut back to before any final_eval line, and evaluates every split again once
        t.checkpoint()
        if group.env.rank == 0:
            _final_eval(evaluated, t, t.splits["final"], stop)
            _floor(t)
        asked = max(group.gather_int(stop.requested or 0))  # a signal during the final evaluation
        if asked:  # stops it (saved: the same command evaluates again), never ends as a success
            raise interrupted(asked, f"in {rec.out} during the final evaluation")
        rec.stopped(status)
        group.barrier()  # the other ranks wait for rank 0's final evaluation: tear down together
        t.algo.close()  # asgd, easgd: the parameter server's rpc ends
    except BaseException as e:
        t.algo.close(graceful=False)  # asgd, easgd: this rank's rpc ends without waiting for the others
        raise_as(e, rec.fail(e, t.meter))
    return rec.finish(status, graph_figures(t.local))


def _epochs(t: Trainer) -> str:
    """The state machine (docs/spec.md C): train epoch after epoch until a stopping rule holds; returns
    why training stopped (success, time_cap, max_epochs). A signal stops it at a read point."""
    tc, prog = t.cfg.train, t.prog
    t.model.train()
    # newbob's stopping rule ends training as the last epoch would (train/schedule.py); stop_after_epochs
    # stops it earlier, the schedule staying max_epochs
    last_epoch = min(tc.stop.max_epochs, tc.stop.after_epochs or tc.stop.max_epochs)
    try:
        while prog.status is None and prog.epoch <= last_epoch and not schedule_ended(tc, prog.eval_losses):
            if _train_epoch(t):
                _end_epoch(t, last_epoch)
    finally:  # whatever ended training (a signal inside an evaluation among them): no reader outlives it
        t.close_ahead()  # the readers of an epoch that will not be trained
    prog.status = prog.status or ("max_epochs" if tc.stop.target > 0 else "success")
    return prog.status


def _train_epoch(t: Trainer) -> bool:
    """The epoch's batches from ``prog.start_batch`` on; False when the time cap stopped it."""
    with t.loader() as loader:  # its readers stopped however the epoch ends
        return _train_batches(t, loader)


def _train_batches(t: Trainer, loader) -> bool:
    """The loader's batches, trained; False when the time cap stopped the epoch."""
    tc, prog, state = t.cfg.train, t.prog, t.state
    t.rec.epoch_started()
    last = time.perf_counter()
    for batch in t.rec.batches(loader):  # timed: each wait for data is the recorder's
        # -- training
        if prog.iteration:  # the learning rate of this step (train/schedule.py)
            state.scheduler.step()
        prog.iteration += 1
        step = train_step(t.model, batch, state.optimizer, state.scaler, t.group.device, tc, t.cfg.augment)
        prog.start_batch += 1
        t.algo.after_step(prog.start_batch)  # local SGD: the ranks' models combined every algo.sync_every batches
        prog.impossible_utts += step.impossible
        now = time.perf_counter()
        batch_s, last = now - last, now
        t.meter.add(prog.iteration, step, t.rec.iteration_row(batch, batch_s, t.algo.comm.take()))
        if not read_point(prog.iteration, tc):
            continue
        _settle(t)
        # -- generating sentences
        if prog.iteration % tc.eval.sentence_every == 0:
            t.rec.sentences(batch, step, t.model)
        # -- saving checkpoint
        if prog.iteration % tc.system.checkpoint_every == 0:
            t.checkpoint()
        if _time_cap_passed(t):  # a signal stops the run there (saved, recorded as interrupted)
            prog.status = "time_cap"
            return False
    _settle(t)
    return True


def _end_epoch(t: Trainer, last_epoch: int) -> None:
    """Every rank at an epoch's end: a common model, the divergence check, rank 0's validation
    (its verdict and loss broadcast), the checkpoint; a signal received meanwhile stops the run."""
    tc, prog = t.cfg.train, t.prog
    evaluated = t.algo.before_eval(prog.start_batch)  # every rank: local SGD ends the epoch on a common model
    check_trained(t.state.model, prog, tc)  # a run that cannot train stops here, as diverged
    if prog.epoch < last_epoch:  # the next epoch's readers fill their buffer during the evaluation
        t.start_ahead(prog.epoch + 1)
    # -- evaluating (the model stays resident; its seconds are recorded apart)
    t.rec.epoch_ended()
    verdict = _epoch_eval(evaluated, t) if t.group.env.rank == 0 else None
    prog.status, loss = t.group.broadcast(verdict)
    t.algo.after_eval()  # fsdp: rank 0's evaluation copy leaves the device
    prog.eval_losses.append(loss)  # every rank: the newbob schedule reads it (train/schedule.py)
    prog.epoch += 1
    prog.start_batch = 0
    t.checkpoint()
    asked = max(t.group.gather_int(t.stop.requested or 0))
    if asked and prog.status is None:
        raise interrupted(asked, f"in {t.rec.out} after epoch {prog.epoch - 1}")


def _settle(t: Trainer) -> None:
    """The one host read: the pending steps' losses and skip flags, recorded and counted in
    step order (a divergence aborts here)."""
    reads = t.meter.read()
    t.rec.steps_read(reads)
    count_steps(t.prog, reads, t.cfg.train.stop.max_bad_losses)


def _time_cap_passed(t: Trainer) -> bool:
    """At a read point, all ranks together: whether the time cap passed. A signal any rank was
    sent stops the run here instead: saved where it stopped, recorded as interrupted."""
    tc, prog = t.cfg.train, t.prog
    cap = tc.stop.time_cap_minutes > 0 and t.rec.now() >= 60 * tc.stop.time_cap_minutes
    asked = max(t.group.gather_int(t.stop.requested or int(cap)))
    if asked > 1:
        if prog.iteration % tc.system.checkpoint_every:
            t.checkpoint()
        raise interrupted(asked, f"in {t.rec.out} at iteration {prog.iteration} (epoch {prog.epoch})")
    return bool(asked)


def _floor(t: Trainer) -> None:
    """Rank 0, after training: the step against its floor (train/floor.py) into the summary, where
    ``train.floor.steps`` asks; a data-parallel run's steps need every rank, so it says not measured.
    The run has trained and been evaluated by then: a replay that fails (its batches held on a full
    device, a reader's error) is said in the summary's floor, naming the error; the run stands."""
    steps = t.cfg.train.floor.steps
    if not steps or t.stop.requested:
        return
    if t.group.world > 1:
        t.rec.floor = {"steps": steps, "note": f"not measured: a data-parallel run ({t.group.world} processes)"}
        return
    try:
        with t.rec.off_clock():  # no part of the run's clock, nor its samples
            t.rec.floor = floor.measure(t, t.run.rows.iterations())
    except (RuntimeError, OSError, MemoryError, SpeechperfError) as e:  # torch's out of memory is a RuntimeError
        t.rec.floor = {"steps": steps, "note": f"not measured: the replay failed: {type(e).__name__}: {e}"[:400]}
        if t.group.device.type == "cuda":
            torch.cuda.empty_cache()


# ---- evaluation ------------------------------------------------------------------------
def _evaluate(model, t: Trainer, split: str, beam: int, **kw) -> dict:
    tc = t.cfg.train
    return evaluate(model, t.data, split, t.batching, t.group.device, decoder=tc.eval.decoder, beam=beam,
                    precision=tc.system.precision, mode=tc.eval.mode, workers=tc.eval.threads, units=t.units,
                    ctc_kernel=tc.system.ctc_kernel, **kw)


def _epoch_eval(model, t: Trainer) -> tuple[str | None, float]:
    """The epoch's validation (rank 0): (``success`` once the target is reached, else None; its loss)."""
    tc, rec = t.cfg.train, t.rec
    rec.eval_started()
    r = _evaluate(model, t, tc.eval.split, tc.eval.beam, keep_pairs=3, intervals=False)
    if "errors" in r:  # the per-utterance counts; the stop rule reads the point values only, so the
        with rec.off_clock():  # intervals are no time to accuracy
            r = with_intervals(r)
    rec.evaluated(r, final=False)
    if tc.stop.target > 0:
        history = [(e["clock_s"], e[tc.stop.target_metric]) for e in rec.prog.evals]  # speechperf/metric.py's names
        if tta_minutes(history, tc.stop.target, tc.stop.target_epochs) is not None:
            return "success", r["loss"]
    return None, r["loss"]


def _final_eval(model, t: Trainer, splits: list[str], stop: StopSignals) -> None:
    """Table 5: the final-evaluation splits (verified before training), with the final beam
    width; a stop signal ends it between splits. The kept evaluation batches are freed after it."""
    try:
        for split in splits:
            if stop.requested:
                return
            t.rec.evaluated(_evaluate(model, t, split, t.cfg.train.eval.final_beam), final=True)
    finally:
        release_resident()  # their device memory is no longer the run's
