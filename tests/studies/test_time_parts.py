"""Where the time to accuracy went: the rows' windows tile the TTA clock, each part from its own
rows, the gaps between them measured (studies/time_parts.py)."""
import pytest

from speechperf.studies.time_parts import decoding, gaps, shares, time_parts


def _it(iteration, epoch, clock_s, step_s, data_s, ckpt_s=0.0):
    return {"iteration": iteration, "epoch": epoch, "clock_s": clock_s, "step_s": step_s, "data_s": data_s,
            "ckpt_s": ckpt_s}


# The TTA clock: 0-1 the loader starts; iteration 1 [1, 3] (0.5 s waiting for data); a checkpoint at its
# read point (1 s) inside iteration 2's window [3, 6]; 6-7 the epoch ends; evaluation 1 [7, 10]; 10-12
# the epoch-end checkpoint (1.5 s, on epoch 2's first row) and the next loader; iterations 3 [12, 14]
# and 4 [14, 15]; evaluation 2 [15, 18], not split into its parts.
ITERATIONS = [_it(1, 1, 3.0, 2.0, 0.5), _it(2, 1, 6.0, 3.0, 0.5, 1.0), _it(3, 2, 14.0, 2.0, 1.0, 1.5),
              _it(4, 2, 15.0, 1.0, 0.0)]
EVALS = [{"epoch": 1, "clock_s": 10.0, "eval_s": 3.0, "eval_forward_s": 1.0, "eval_decode_s": 1.5, "eval_score_s": 0.5},
         {"epoch": 2, "clock_s": 18.0, "eval_s": 3.0, "eval_forward_s": None, "eval_decode_s": None,
          "eval_score_s": None}]


def test_parts_to_the_first_evaluation():
    p = time_parts(ITERATIONS, EVALS, 10.0)
    assert {k: p[f"{k} s"] for k in ("steps", "data", "eval", "checkpoints", "epoch changes")} == pytest.approx(
        {"steps": 3.0, "data": 1.0, "eval": 3.0, "checkpoints": 1.0, "epoch changes": 2.0})
    assert (p["eval forward s"], p["eval decode s"], p["eval score s"]) == (1.0, 1.5, 0.5)
    assert p["total s"] == pytest.approx(10.0) and p["note"] is None
    assert shares(p) == "steps 30% data 10% eval 30% (fwd 10 dec 15 score 5) ckpt 10% epoch 20%"


def test_an_epoch_end_checkpoint_is_a_checkpoint_not_an_epoch_change():
    p = time_parts(ITERATIONS, EVALS, 18.0)
    assert {k: p[f"{k} s"] for k in ("steps", "data", "eval", "checkpoints", "epoch changes")} == pytest.approx(
        {"steps": 5.0, "data": 2.0, "eval": 6.0, "checkpoints": 2.5, "epoch changes": 2.5})
    assert p["eval decode s"] is None  # one evaluation not split: evaluation shown as one part
    assert p["total s"] == pytest.approx(18.0) and "(for" not in shares(p)


def test_overlapping_windows_and_older_rows_are_said():
    overlapping = [dict(ITERATIONS[0]), {**ITERATIONS[1], "step_s": 4.0}]  # iteration 2 claims [2, 6]
    p = time_parts(overlapping, EVALS, 10.0)
    assert p["total s"] == pytest.approx(11.0)
    assert p["note"] == "parts sum to 11.0 s of the TTA 10.0 s: the rows' windows overlap or miss time"
    older = [{**r, "data_s": None, "ckpt_s": None} for r in ITERATIONS]
    p = time_parts(older, EVALS, 10.0)
    assert p["data s"] == 0.0 and p["steps s"] == pytest.approx(5.0)
    assert p["note"] == "data wait not recorded (rows of an older release): in steps"


def test_gaps():
    assert gaps([(1.0, 3.0), (3.0, 6.0), (7.0, 10.0)], 10.0) == pytest.approx(2.0)
    assert gaps([], 4.0) == 4.0
    assert shares({"total s": 0.0}) == "no time recorded"


def test_the_decodes_summed_to_the_tta_and_older_rows_give_none():
    rows = [{"clock_s": 10.0, "decode_threads": 8, "decode_frames": 40_000, "decode_busy_s": 4.0, "decode_cpu_s": 2.0},
            {"clock_s": 18.0, "decode_threads": 6, "decode_frames": 20_000, "decode_busy_s": 1.0, "decode_cpu_s": 1.0},
            {"clock_s": 30.0, "decode_threads": 16, "decode_frames": 1, "decode_busy_s": 9.0, "decode_cpu_s": 9.0}]
    assert decoding(rows, 18.0) == {"threads": 8, "frames": 60_000, "busy s": 5.0, "cpu s": 3.0,
                                    "frames per thread-s": 12_000.0, "core share %": 60.0}
    assert decoding(rows[:1] + [{**rows[1], "decode_busy_s": None}], 18.0) is None  # a row of an older release
    assert decoding(rows, 5.0) is None  # no evaluation yet
    assert decoding([{**rows[0], "decode_busy_s": 0.0, "decode_cpu_s": 0.0}], 10.0)["core share %"] is None
