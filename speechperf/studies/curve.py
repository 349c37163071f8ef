"""Reference curves: a reference seed's per-epoch validation loss, CER and WER as its run
recorded them (full float precision), with the settings that make them reproducible, and the
exact comparison of a run against them.

A reference seed (``config/rcp/PRESET.json``, studies/rcp.py) keeps ``curves``: one per
features folder it was measured on, each ``{"epochs": [{"epoch", "loss", METRIC...}],
"settings": {...}}`` where the settings are :func:`settings_of` a run: the seed, threads,
the ISA cap and the kernels it gave (torch's CPU capability, oneDNN's ISA and version),
torch's version and the features checksum (features/checksum.py). A run is *comparable* to
a curve when every setting in :data:`MUST_MATCH` is equal and it trained the reference's
recipe; then its curve is the reference's bit for bit, or differs from some epoch: a machine
whose stack does not compute the benchmark as the reference's did. A run that is not
comparable says why (another torch, thread count, features...), never "differs".
"""
from __future__ import annotations

import math

from speechperf.metric import metric
from speechperf.results import upgrade
from speechperf.studies import rcp
from speechperf.studies.precisions import precision
from speechperf.hardware import kernel_fingerprint

METRICS = rcp.CURVE_METRICS  # what a curve holds per epoch (evals columns); rcp checks a reference's on load
# settings that must be equal for a curve to be reproducible, in the order they are reported
# (the CPU's maker too: under the same cap and libraries a 1-thread run on an Intel Xeon
# differed from the AMD EPYC curve at epoch 1; two AMD generations, AVX2 and AVX-512, agreed)
MUST_MATCH = ("torch", "threads", "cap", "MKL_CBWR", "cpu_capability", "features_sha256", "seed", "cpu_vendor",
              "optim_impl", "ctc_kernel")
# a setting a curve recorded before it existed, as it was then: every curve before "optim_impl" was
# trained with torch's default optimizer step except transducer-cpu's, whose file says "fused"; every
# curve before "ctc_kernel" with torch's CTC loss
RECORDED_BEFORE = {"optim_impl": "default", "ctc_kernel": "torch"}
# the settings a reproduction trains with whatever the preset says now: the kernels of the same loss and
# optimizer step, which sum in another order (not part of the recipe)
FORCED = {"optim_impl": "train.optim.impl", "ctc_kernel": "train.system.ctc_kernel"}
# settings that must be equal as well where both sides recorded them (oneDNN's ISA is only
# read where oneDNN printed it; its version where torch's build names it)
MATCH_WHERE_KNOWN = ("onednn_isa", "onednn", "mkl")
ONE_THREAD = 1  # the references' thread count: more threads split sums differently per machine
IDENTICAL, DIFFERS, NOT_COMPARABLE = "identical", "differs", "cannot be compared"


def curve_of(evals: list[dict]) -> list[dict]:
    """A run's per-epoch validation rows (results.db ``evals``, final=0, one split, in epoch
    order) as a curve: [{"epoch", "loss", "cer", "wer", ...}] (:data:`METRICS`), the floats as recorded."""
    return [{"epoch": int(e["epoch"]), **{m: e.get(m) for m in METRICS}} for e in evals]


def settings_of(config: dict, env: dict) -> dict:
    """What made a run's curve what it is, from its config.json and env.json."""
    isa = env.get("isa") or {}
    train = config.get("train", {})
    return {"seed": train.get("seed"), "threads": train.get("system", {}).get("threads"),
            "cap": isa.get("cap"), "cpu_capability": isa.get("cpu_capability"), "onednn_isa": isa.get("onednn_isa"),
            "onednn": isa.get("onednn"), "ONEDNN_MAX_CPU_ISA": isa.get("ONEDNN_MAX_CPU_ISA"),
            "ATEN_CPU_CAPABILITY": isa.get("ATEN_CPU_CAPABILITY"), "mkl": isa.get("mkl"),
            "MKL_CBWR": isa.get("MKL_CBWR"), "torch": (env.get("libraries") or {}).get("torch"),
            "numpy": (env.get("libraries") or {}).get("numpy"),
            "features_sha256": (env.get("features") or {}).get("sha256"),
            "cpu_vendor": cpu_vendor(env.get("cpu_model")),
            # the optimizer's kernels (train.optim.impl): the same training, other float sums
            "optim_impl": (train.get("optim") or {}).get("impl", "default"),
            # the CTC loss's kernel (train.system.ctc_kernel): the same loss, other float sums
            "ctc_kernel": (train.get("system") or {}).get("ctc_kernel", RECORDED_BEFORE["ctc_kernel"]),
            **kernel_fingerprint.as_settings(isa.get("kernels"))}


def cpu_vendor(cpu_model: str | None) -> str | None:
    """The CPU's maker as its model name says ("AMD", "Intel"); None where it names neither."""
    words = (cpu_model or "").replace("(R)", " ").split()
    return next((v for v in ("AMD", "Intel") if v in words), None)


def curves_of(ref: dict, seed: int) -> list[dict]:
    """The curves of reference seed ``seed`` ([] when the seed has none or is not there)."""
    return next((s.get("curves") or [] for s in ref.get("seeds", []) if s.get("seed") == seed), [])


def has_curves(ref: dict) -> bool:
    return any(s.get("curves") for s in ref.get("seeds", []))


def pick(ref: dict, seed: int, features: str | None, vendor: str | None = None) -> dict | None:
    """The curve of ``seed`` measured on the features whose checksum is ``features``, on a CPU
    of ``vendor`` where the seed has one (else another maker's, which :func:`comparable` refuses
    by name)."""
    on = [c for c in curves_of(ref, seed) if c["settings"].get("features_sha256") == features]
    return next((c for c in on if c["settings"].get("cpu_vendor") == vendor), on[0] if on else None)


def differences(mine: dict, theirs: dict) -> list[str]:
    """The settings in which ``mine`` differs from ``theirs`` ("torch 2.12.0 (reference
    2.13.0+cpu)"), the ones that must match first."""
    out = []
    for key in MUST_MATCH + MATCH_WHERE_KNOWN:
        a, b = setting(mine, key), setting(theirs, key)
        if a != b and (key in MUST_MATCH or (a is not None and b is not None)):
            out.append(f"{key} {a} (reference {b})")
    families = kernel_fingerprint.differing(mine, theirs)  # None: a side without fingerprints (before they existed)
    if families:
        out.append(f"kernels that compute otherwise: {', '.join(families)}")
    return out


def setting(settings: dict, key: str):
    """``settings[key]``, or what a curve recorded before ``key`` existed trained with (:data:`RECORDED_BEFORE`)."""
    return settings.get(key, RECORDED_BEFORE.get(key))


def forced(settings: dict) -> list[str]:
    """The overrides that make a reproduction train with the kernels a curve of ``settings`` was
    trained with (:data:`FORCED`: ``train.optim.impl=default``, ``train.system.ctc_kernel=torch``)."""
    return [f"{field}={setting(settings, key)}" for key, field in FORCED.items()]


def comparable(mine: dict, theirs: dict) -> str | None:
    """None when a run of settings ``mine`` can reproduce a curve of settings ``theirs``;
    else why not, and what to run instead. The seed, torch, threads (1), the cap and the
    features must be the same, and the optimizer's step (fused or not) and the CTC kernel (other float sums)."""
    rerun = f"rerun with --isa {theirs.get('cap') or 'avx2'} threads=1"  # the cap the curve was made under
    if mine.get("threads") != ONE_THREAD:
        threads = mine.get("threads")
        return f"ran on {'all cores' if not threads else f'{threads} threads'}; {rerun}"
    if not mine.get("cap"):
        return f"no ISA cap; {rerun}"  # without one, the kernels follow the machine
    found = differences(mine, theirs)
    missing = [d for d in found if d.split(" ", 1)[0] in ("torch", "threads", "features_sha256",
                                                          "seed", "cap", "MKL_CBWR", "cpu_vendor", *FORCED)]
    if missing and kernel_fingerprint.differing(mine, theirs) is not None:  # another maker: which kernels differ
        missing += [d for d in found if d.startswith("kernels")] or ["the kernels' fingerprints agree"]
    return "; ".join(missing) if missing else None


def compare(mine: list[dict], reference: list[dict], epochs: int | None = None) -> dict:
    """``mine`` against ``reference`` epoch by epoch, bit for bit, over the first ``epochs``
    (default: every epoch both have): {"verdict": identical|differs, "epochs": compared,
    "first": None or {"epoch", "metric", "mine", "reference"}, "text"}."""
    n = min(len(mine), len(reference), epochs or len(reference))
    for a, b in zip(mine[:n], reference[:n]):
        for m in held(b):
            if not same(a.get(m), b.get(m)):
                first = {"epoch": a["epoch"], "metric": m, "mine": a.get(m), "reference": b.get(m)}
                return {"verdict": DIFFERS, "epochs": n, "first": first, "text": differs_text(a, b)}
    return {"verdict": IDENTICAL, "epochs": n, "first": None,
            "text": f"identical through epoch {n}" if n else "no epoch to compare"}


def same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def held(point: dict) -> tuple[str, ...]:
    """What a reference curve's epoch ``point`` is compared on: the loss and every metric of
    :data:`METRICS` it recorded."""
    return tuple(m for m in METRICS if m == "loss" or m in point)


def differs_text(a: dict, b: dict) -> str:
    """``differs from epoch 2: CER 30.000000000000004 vs 30.0, WER ..., loss ...``."""
    named = [(metric(m).label, m) for m in held(b) if m != "loss"] + [("loss", "loss")]
    return f"differs from epoch {a['epoch']}: " + ", ".join(f"{label} {_fmt(a.get(m))} vs {_fmt(b.get(m))}"
                                                           for label, m in named)


def _fmt(x) -> str:
    """Enough digits to show where two floats differ (repr: the shortest exact form)."""
    return repr(x) if isinstance(x, float) else str(x)


def run_reproduction(config: dict, env: dict, evals: list[dict]) -> dict | None:
    """A finished run against its reference seed's curve, for its summary, ``tta`` and the
    report: None when the reference has no curve of its seed on its features; else
    {"verdict", "text", "flagged"}: "reproduces the reference bit for bit through epoch N",
    or, for a run that could have matched (cap, 1 thread, same torch, same features) and did
    not, a flagged "differs from epoch k ..."; a run that could not match says why."""
    try:
        ref = rcp.load_reference(config.get("preset"), precision(config))
    except rcp.ReferenceError:
        return None  # study.run_check names a damaged reference file
    if not ref or not has_curves(ref):
        return None
    mine = settings_of(config, env)
    curve = pick(ref, mine["seed"], mine["features_sha256"], mine["cpu_vendor"])
    if curve is None:
        return None
    why = comparable(mine, curve["settings"]) or recipe_differs(ref, config)
    if why:
        return {"verdict": NOT_COMPARABLE, "text": f"reference curve not compared: {why}", "flagged": False}
    result = compare(curve_of(evals), curve["epochs"])
    if result["verdict"] == IDENTICAL and result["epochs"]:
        return {"verdict": IDENTICAL, "flagged": False,
                "text": f"reproduces the reference bit for bit through epoch {result['epochs']}"}
    if result["verdict"] == IDENTICAL:
        return None  # no epoch evaluated yet
    return {"verdict": DIFFERS, "flagged": True, "first": result["first"],
            "text": f"FAILED: could have reproduced the reference curve and {result['text']}"}


def recipe_differs(ref: dict, config: dict) -> str | None:
    """Why ``config`` does not train the reference's recipe (None: it does)."""
    mine, theirs = rcp._completed(rcp.recipe(config)), rcp._completed(upgrade.recipe(ref.get("recipe", {})))
    differ = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
    if not differ:
        return None
    return "another recipe: " + ", ".join(f"{k}={mine.get(k)!r} (reference {theirs.get(k)!r})" for k in differ[:3])
