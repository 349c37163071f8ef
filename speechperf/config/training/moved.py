"""The one table of where an earlier release's flat ``train`` keys now live.

Until this release ``TrainConfig`` was one flat dataclass: ``train.lr=0.1`` on the command line,
``lr = 0.1`` under ``[train]`` in a preset, ``"train": {"lr": 0.1, ...}`` in every run folder's
config.json and checkpoint, and ``"train.lr"`` in the reference recipes (config/rcp/*.json). Each
of those is read through :data:`MOVED`: a stored config or recipe silently (results/upgrade.py,
studies/rcp.py), a user's override or preset key upgraded with a one-line note on stderr
(speechperf.config).
"""
from __future__ import annotations

# old flat field -> its path under train (a field that stayed at the top keeps its name)
MOVED = {
    "protocol": "protocol", "seed": "seed", "train_splits": "train_splits",
    "optimizer": "optim.name", "lr": "optim.lr", "weight_decay": "optim.weight_decay",
    "grad_clip": "optim.grad_clip", "optimizer_impl": "optim.impl",
    "lr_schedule": "schedule.name", "warmup_iters": "schedule.warmup_iters", "lr_decay": "schedule.lr_decay",
    "lr_step_epochs": "schedule.lr_step_epochs", "lr_min": "schedule.lr_min",
    "eval_split": "eval.split", "final_splits": "eval.final_splits", "eval_decoder": "eval.decoder",
    "eval_beam": "eval.beam", "final_beam": "eval.final_beam", "eval_mode": "eval.mode",
    "eval_threads": "eval.threads", "eval_resident_mb": "eval.resident_mb", "sentence_every": "eval.sentence_every",
    "target_metric": "stop.target_metric", "target": "stop.target", "target_epochs": "stop.target_epochs",
    "max_epochs": "stop.max_epochs", "time_cap_minutes": "stop.time_cap_minutes",
    "stop_after_epochs": "stop.after_epochs", "max_bad_losses": "stop.max_bad_losses",
    "max_skipped_fraction": "stop.max_skipped_fraction",
    "device": "system.device", "dist_backend": "system.dist_backend", "precision": "system.precision",
    "deterministic": "system.deterministic", "sync_every": "system.sync_every", "compile": "system.compile",
    "cuda_graphs": "system.cuda_graphs", "graph_frames": "system.graph_frames", "graph_batch": "system.graph_batch",
    "threads": "system.threads", "checkpoint_every": "system.checkpoint_every",
    "floor_steps": "floor.steps", "floor_window": "floor.window",
}


def upgrade_train(train: dict) -> dict:
    """A recorded ``train`` section with its flat keys of :data:`MOVED` moved into their sections
    (a new dict; one already in sections, or a key the table does not name, stays as it is)."""
    out: dict = {}
    for key, value in train.items():
        path = MOVED.get(key, key).split(".") if not isinstance(value, dict) else [key]
        node = out
        for name in path[:-1]:
            node = node.setdefault(name, {})
        node[path[-1]] = value if not isinstance(value, dict) else {**node.get(path[-1], {}), **value}
    return out


def upgrade_key(key: str) -> str:
    """A dotted ``train.OLD`` key (a recipe's, an override's) as its new ``train.SECTION.FIELD``;
    any other key as it is."""
    head, _, name = key.partition(".")
    if head == "train" and name in MOVED:
        return f"train.{MOVED[name]}"
    return key
