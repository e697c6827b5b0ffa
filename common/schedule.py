"""The learning rate's schedule: a linear warmup, then a cosine decay to min_lr at lr_decay_iters, or 'wsd' (warmup,
stable, decay: the peak until the last lr_decay_fraction of lr_decay_iters, then a linear decay to min_lr); one
scale for every optimizer's own peak (AdamW's learning_rate, Muon's muon_lr)."""

import math
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Schedule:
    learning_rate: float
    min_lr: float
    muon_lr: float
    decay_lr: bool
    lr_schedule: str
    warmup_iters: int
    lr_decay_iters: int
    lr_decay_fraction: float

    @classmethod
    def of(cls, settings):
        """The schedule train.py's settings name."""
        return cls(**{f.name: settings[f.name] for f in fields(cls)})

    def scale(self, it):
        """The schedule at iteration it, as a fraction of the peak (every optimizer's own learning rate)."""
        floor = self.min_lr / self.learning_rate if self.learning_rate else 0.0
        if not self.decay_lr:
            return 1.0
        if it < self.warmup_iters:
            return (it + 1) / (self.warmup_iters + 1)
        if it > self.lr_decay_iters:
            return floor
        if self.lr_schedule == 'wsd':
            decay_start = max(self.warmup_iters, self.lr_decay_iters - self.lr_decay_fraction * self.lr_decay_iters)
            ratio = (it - decay_start) / max(1, self.lr_decay_iters - decay_start)
            return 1.0 if it < decay_start else floor + (1.0 - ratio) * (1.0 - floor)
        ratio = (it - self.warmup_iters) / max(1, self.lr_decay_iters - self.warmup_iters)
        return floor + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (1.0 - floor)

    def set_lr(self, optim, it):
        """Every optimizer's learning rate at iteration it; -> AdamW's (the one logged)."""
        scale = self.scale(it)
        for group in optim.param_groups:
            group['lr'] = scale * (self.muon_lr if 'ns_steps' in group else self.learning_rate)  # Muon's have ns_steps
        return scale * self.learning_rate
