"""How busy the accelerator was (studies/busy.py): utilization samples at known times inside and
outside a run's training phases and evaluations give known means, on the TTA clock of a run
resumed in a second process as of one."""
import pytest

from speechperf.studies.busy import busy, busy_text, device_of, phases


def _it(iteration, epoch, clock_s, step_s):
    return {"iteration": iteration, "epoch": epoch, "clock_s": clock_s, "step_s": step_s}


# The TTA clock (tests/studies/test_time_parts.py's run): iterations 1 [1, 3] and 2 [3, 6] of epoch 1,
# its evaluation [7, 10]; iterations 3 [12, 14] and 4 [14, 15] of epoch 2, its evaluation [15, 18];
# iteration 5 [19, 20] of epoch 3, cut before its evaluation.
ITERATIONS = [_it(1, 1, 3.0, 2.0), _it(2, 1, 6.0, 3.0), _it(3, 2, 14.0, 2.0), _it(4, 2, 15.0, 1.0), _it(5, 3, 20.0, 1.0)]
EVALS = [{"epoch": 1, "clock_s": 10.0, "eval_s": 3.0}, {"epoch": 2, "clock_s": 18.0, "eval_s": 3.0}]
# (t, util %): 0.5 before the first step, 2 and 7 in epoch 1's training (7: its last period, ending as the
# evaluation starts), 8 in its evaluation, 11 in the epoch change, 13 in epoch 2's training, 16 in its
# evaluation, 19.5 after the TTA moment 18
POINTS = [(0.5, 10.0), (2.0, 90.0), (7.0, 80.0), (8.0, 20.0), (11.0, 0.0), (13.0, 100.0), (16.0, 30.0), (19.5, 50.0)]


def _samples(points, source="gpu0", metric="util_pct", segment=1.0):
    return [{"t": t, "source": source, "metric": metric, "value": v, "segment": segment} for t, v in points]


def test_phases_from_the_rows():
    assert phases(ITERATIONS, EVALS, 18.0) == {"tta": [(0.0, 18.0)], "training": [(1.0, 7.0), (12.0, 15.0)],
                                               "eval": [(7.0, 10.0), (15.0, 18.0)]}
    # an epoch without its evaluation before the moment: training to its last row there
    assert phases(ITERATIONS, EVALS, 20.0)["training"] == [(1.0, 7.0), (12.0, 15.0), (19.0, 20.0)]
    assert phases(ITERATIONS, EVALS, 10.0) == {"tta": [(0.0, 10.0)], "training": [(1.0, 7.0)], "eval": [(7.0, 10.0)]}


def test_known_samples_give_known_means():
    b = busy(_samples(POINTS), ITERATIONS, EVALS, 18.0, "cuda:0")
    assert (b["device"], b["metric"], b["sources"], b["note"]) == ("GPU", "util_pct", ["gpu0"], None)
    assert (b["tta %"], b["tta samples"]) == (pytest.approx(330.0 / 7), 7)  # all but the one after 18 s
    assert (b["training %"], b["training samples"]) == (pytest.approx(90.0), 3)
    assert (b["eval %"], b["eval samples"]) == (pytest.approx(25.0), 2)
    assert busy_text(b) == "GPU busy 47% (training 90% eval 25%; 7 samples)"
    early = busy(_samples(POINTS), ITERATIONS, EVALS, 10.0, "cuda:0")  # to the first evaluation
    assert (early["tta %"], early["training %"], early["eval %"]) == (50.0, 85.0, 20.0)


def test_a_resumed_run_reads_its_processes_on_one_clock():
    # killed at 12.5 in epoch 2 and resumed: the second process's samples continue the TTA clock
    first = _samples([p for p in POINTS if p[0] < 12.5], segment=1.0)
    second = _samples([p for p in POINTS if p[0] >= 12.5] + [(14.5, 60.0)], segment=2.0)
    b = busy(first + second, ITERATIONS, EVALS, 18.0, "cuda:0")
    assert (b["training %"], b["training samples"]) == (pytest.approx(330.0 / 4), 4)  # 90, 80; 100, 60
    assert (b["tta %"], b["tta samples"], b["eval %"]) == (pytest.approx(390.0 / 8), 8, pytest.approx(25.0))


def test_two_gpus_are_averaged_and_said():
    both = _samples(POINTS) + _samples([(t, 0.0) for t, _ in POINTS], source="gpu1")
    b = busy(both, ITERATIONS, EVALS, 18.0, "cuda:0")
    assert b["sources"] == ["gpu0", "gpu1"] and b["training %"] == pytest.approx(45.0) and b["training samples"] == 6
    assert b["note"] == "averaged over gpu0, gpu1: the GPUs the sampler read"


def test_a_cpu_run_shows_the_cpu_and_a_gpu_run_never_does():
    cpu = _samples(POINTS, source="cpu", metric="util_machine_pct") + _samples([(2.0, 400.0)], source="cpu",
                                                                                metric="util_core_pct")
    b = busy(cpu, ITERATIONS, EVALS, 18.0, "cpu")
    assert (b["device"], b["metric"], b["training %"]) == ("CPU", "util_machine_pct", pytest.approx(90.0))
    assert busy_text(b).startswith("CPU busy 47% (training 90% ")
    none = busy(cpu, ITERATIONS, EVALS, 18.0, "cuda:0")  # NVML missing: the CPU's share is not the GPU's
    assert (none["device"], none["tta %"], none["tta samples"]) == (None, None, 0)
    why = "no GPU utilization samples (NVML or amdsmi)"
    assert none["note"] == why and busy_text(none) == f"busy: {why}"
    assert device_of([], "cpu") == (None, "no CPU utilization samples")
    # a CPU run on a machine with GPUs: its sampler saw them idle; its share is the CPU's
    assert device_of(cpu + _samples(POINTS), "cpu") == (("CPU", "util_machine_pct"), None)
    assert device_of(_samples(POINTS), None) == (("GPU", "util_pct"), None)  # no device recorded: the GPUs sampled


def test_a_phase_without_samples_is_none_and_said():
    b = busy(_samples([(11.0, 40.0)]), ITERATIONS, EVALS, 18.0, "cuda:0")  # only in the epoch change
    assert (b["tta %"], b["training %"], b["eval %"]) == (40.0, None, None)
    assert b["note"] == "no sample inside training, eval"
    assert busy_text(b) == "GPU busy 40% (training NA eval NA; 1 samples)"
