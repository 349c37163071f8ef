"""What a comparison compares: each run's precision, and the words a ratio between runs in
different precisions carries.

A run at ``train.system.precision=auto`` trains in the fastest precision its machine runs natively
(train/auto_precision.py); its config.json records that precision and its env.json the choice.
Two machines compared at ``auto`` may then train in different precisions: the ratio between
them compares each machine at its best (MLPerf's closed division lets each system pick its
numerics and checks convergence instead), never the two machines in one precision. Every table
that sets runs side by side (``tta``, the report, the seed groups' comparisons) shows the
precision of each run, and says "each at its best" beside a ratio between runs in different
precisions; runs that share one precision get no extra words.
"""
from __future__ import annotations

from typing import Iterable

DEFAULT = "fp32"  # the precision of a run recorded before train.system.precision existed


def precision(config: dict) -> str:
    """The precision a run trained in (its config.json's: ``auto`` is recorded as the one chosen)."""
    return ((config.get("train") or {}).get("system") or {}).get("precision") or DEFAULT


def chosen_by(env: dict) -> str:
    """``auto`` where ``train.system.precision=auto`` chose the run's precision, else ``given``."""
    return "auto" if env.get("precision_choice") else "given"


def label(config: dict, env: dict) -> str:
    """``bf16 (auto)``, ``fp32``: the run's precision and whether ``auto`` chose it."""
    return precision(config) + (" (auto)" if chosen_by(env) == "auto" else "")


def each_at_best(precisions: Iterable[str]) -> str | None:
    """The words beside a comparison of runs in these precisions: None where they share one,
    else "each at its best (fp32, bf16): not a like-for-like precision comparison"."""
    seen = list(dict.fromkeys(precisions))
    if len(seen) < 2:
        return None
    return f"each at its best ({', '.join(seen)}): not a like-for-like precision comparison"


def precision_notes(rows: list[dict]) -> list[str]:
    """One line per workload whose rows (each with ``workload`` and ``precision``) hold runs of
    different precisions: its 'relative' compares each at its best."""
    lines = []
    for name in dict.fromkeys(r["workload"] for r in rows):
        words = each_at_best(r.get("precision") or DEFAULT for r in rows if r["workload"] == name)
        if words:
            lines.append(f"{name}: 'relative' sets runs in different precisions side by side, {words}")
    return lines


def choice_words(choice: dict | None) -> str | None:
    """A recorded ``precision_choice`` in one line ("auto: bf16 (fp32 0.412 s, bf16 0.288 s a step;
    measured in 3.1 s)"); None: the precision was given."""
    if not choice:
        return None
    steps = ", ".join(f"{p} {s:.3g} s" for p, s in choice.get("candidates", {}).items())
    how = "cached" if choice.get("cached") else f"measured in {choice.get('seconds') or 0.0:.1f} s"
    text = f"auto: {choice.get('chosen')}" + (f" ({steps} a step; {how})" if steps else "")
    return text + (f"; {choice['note']}" if choice.get("note") else "")
