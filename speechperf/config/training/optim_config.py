"""``[train.optim]``: the optimizer and its update (train/step.py's ``make_optimizer``)."""
from __future__ import annotations

from dataclasses import dataclass

from speechperf.section import setting

OPTIMIZERS = ("adadelta", "adamw", "sgd", "lamb")  # train.optim.name values (train/step.py's make_optimizer)
IMPLS = ("default", "foreach", "fused")  # train.optim.impl values


@dataclass(frozen=True)
class OptimConfig:
    """The optimizer, its learning rate, weight decay and gradient clipping."""

    name: str = setting("adadelta", '"adadelta" (paper), "adamw", "sgd" (plain SGD, paper 003\'s local optimizer) '
                        'or "lamb" (MLPerf\'s RNN-T: Adam\'s moments with a per-tensor trust ratio, train/lamb.py)')
    lr: float = setting(1.0, "learning rate (AdaDelta's default 1.0); the schedule multiplies it "
                        "([train.schedule])")
    weight_decay: float = setting(0.0, "decoupled weight decay (adamw) / L2 (adadelta)")
    grad_clip: float = setting(400.0, "max global gradient norm (DS2 practice); 0 disables")
    impl: str = setting("default", '"default", "foreach" or "fused" (AdamW; fewer, larger kernels on a GPU)')

    def problems(self) -> list[str]:
        """One message per value that cannot train, naming ``train.optim.FIELD=value``."""
        checks = [
            (self.name in OPTIMIZERS, f"train.optim.name={self.name!r} must be one of {', '.join(OPTIMIZERS)}"),
            (self.lr > 0, f"train.optim.lr={self.lr} must be > 0"),
            (self.weight_decay >= 0, f"train.optim.weight_decay={self.weight_decay} must be >= 0"),
            (self.grad_clip >= 0, f"train.optim.grad_clip={self.grad_clip} must be >= 0 (0 disables clipping)"),
            (self.impl in IMPLS, f"train.optim.impl={self.impl!r} must be default, foreach or fused"),
            (self.impl == "default" or self.name != "lamb",
             f"train.optim.impl={self.impl!r}: lamb has one implementation (default)"),
            (self.impl != "fused" or self.name == "adamw",
             f"train.optim.impl=fused needs train.optim.name=adamw (torch has no fused {self.name})"),
        ]
        return [msg for ok, msg in checks if not ok]
