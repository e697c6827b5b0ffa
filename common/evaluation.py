"""train.py's evaluation: the mean loss on fixed batches of each split, shared out across the processes; a task
dataset's greedy accuracy over its scored targets; MoE's load on the val batches."""

import math
import sys

import torch
import torch.distributed as dist
from torch.nn import functional as F

from chapters import moe
from common.data import masked_accuracy
from common.hardware import all_reduce_sum

EVAL_SEED = 20240101  # one fixed set of eval batches for every run, variant and seed


class Evaluation:
    """Estimates of a model's loss on batches (common.batches.Batches): eval_iters random windows of text per
    split, or a task's first eval_iters * batch_size examples (the same ones every time). model: what runs the
    batches (compiled, FSDP's; not DDP's wrapper, whose ranks share them out unevenly); raw_model: its MoE layers'
    counters. skip: splits the model's positions cannot reach (None in the results). progress: a bar on stderr.
    token_bytes: each token id's bytes of text (common.tokenizer.token_bytes), for the val loss in bits per byte
    (out['bpb']); None: not measured."""

    def __init__(self, batches, eval_iters, ctx, model, raw_model, rank=0, world_size=1, distributed=False,
                 fsdp=False, skip=(), progress=False, token_bytes=None):
        self.batches, self.eval_iters, self.ctx, self.model, self.raw_model = batches, eval_iters, ctx, model, raw_model
        self.rank, self.world_size, self.distributed, self.fsdp = rank, world_size, distributed, fsdp
        self.skip, self.progress = skip, progress
        self.token_bytes = None if token_bytes is None or batches.example_data else \
            torch.tensor(token_bytes, dtype=torch.float32, device=batches.device)

    @torch.no_grad()
    def estimate_loss(self):
        """{split: mean loss or None}; a task's accuracy per split in out['accuracy']; with MoE layers, their load
        and balancing losses on the val batches in out['moe']."""
        self.model.eval()
        example_data = self.batches.example_data
        out = {'accuracy': {}} if example_data else {}
        if self.token_bytes is not None:
            out['bpb'] = {}
        splits = ('train', *self.batches.eval_splits)
        evaluated = [s for s in splits if s not in self.skip]
        bar = progress_bar(sum(len(range(self.rank, self.batch_count(s), self.world_size)) for s in evaluated),
                           'evaluating', self.progress)
        for split in splits:
            moe.report_and_reset(self.raw_model)  # restart the experts' counts
            loss, accuracy, bpb = self.evaluate_split(split, bar) if split in evaluated else (None, None, None)
            out[split] = loss
            if 'bpb' in out:
                out['bpb'][split] = bpb
            if example_data:
                out['accuracy'][split] = accuracy
            if split == 'val' and moe.moe_layers(self.raw_model):
                if self.distributed:
                    all_reduce_sum(moe.counters(self.raw_model))
                out['moe'] = moe.report_and_reset(self.raw_model)
        bar.close()
        self.model.train()
        return out

    def batch_count(self, split):
        """How many batches an evaluation of split reads."""
        if not self.batches.example_data:
            return self.eval_iters
        batch_size = self.batches.batch_size
        return math.ceil(min(self.batches.example_shape[split][0], self.eval_iters * batch_size) / batch_size)

    def batch(self, split, k, generator, fetch):
        """The split's k-th evaluation batch (None unless fetch): a window drawn by generator, or examples in order."""
        if not self.batches.example_data:
            return self.batches.get(split, generator, fetch)
        batch_size = self.batches.batch_size
        end = min(self.batches.example_shape[split][0], self.eval_iters * batch_size, (k + 1) * batch_size)
        return self.batches.examples(split, range(k * batch_size, end)) if fetch else None

    def evaluate_split(self, split, bar):
        """(mean loss, greedy accuracy or None, bits per byte or None) on the split's evaluation batches: per batch
        for text, per scored target for a task (its batches score different counts)."""
        generator = torch.Generator().manual_seed(EVAL_SEED + (split != 'train'))
        # loss, right, weight; the next token's nats and the bytes of text they stand for
        sums, batch, n = torch.zeros(5, device=self.batches.device), None, self.batch_count(split)
        for k in range(n):  # every process draws every batch (the same ones, in order), reads its own
            own = k % self.world_size == self.rank
            # FSDP: a rank short of a batch runs the last one too (below), so it reads that one
            batch = self.batch(split, k, generator, fetch=own or (self.fsdp and k == n - 1)) or batch
            if own:
                sums += self.batch_sums(*batch)
                bar.update()
        if self.fsdp and n % self.world_size and self.rank >= n % self.world_size:
            self.join_last_round(batch)
        if self.distributed:
            dist.all_reduce(sums)
        loss, right, weight, nats, text_bytes = sums.tolist()
        bpb = nats / (math.log(2) * text_bytes) if self.token_bytes is not None and text_bytes else None
        return loss / weight, right / weight if self.batches.example_data else None, bpb

    def batch_sums(self, x, y):
        """(loss, right, weight) of one evaluation batch: a text batch weighs 1; a task's, its scored targets."""
        with self.ctx:
            logits, loss = self.model(x, y)
        loss, zero = loss.float(), torch.zeros((), device=loss.device)
        if not self.batches.example_data:
            return torch.stack([loss, zero, torch.ones_like(loss), *self.bits_sums(logits, y)])
        right, scored = masked_accuracy(logits, y)
        return torch.stack([torch.where(scored > 0, loss * scored, 0.0), right.float(), scored.float(), zero, zero])

    def bits_sums(self, logits, y):
        """(nats, bytes): the next-token loss alone (no feature's extra term) summed over the targets that stand for
        text, and their bytes (nanochat's val_bpb: tokenizer-free, so BPE and characters compare)."""
        zero = torch.zeros((), device=logits.device)
        if self.token_bytes is None:
            return zero, zero
        nats = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction='none')
        text_bytes = self.token_bytes[y.flatten()]
        return (nats * (text_bytes > 0)).sum(), text_bytes.sum()

    def join_last_round(self, batch):
        """FSDP's forwards are collective: a rank short of a batch joins the last round, counted nowhere."""
        counters = [(c, c.clone()) for c in moe.counters(self.raw_model)]
        with self.ctx:
            self.model(*batch)
        for c, before in counters:
            c.copy_(before)


def progress_bar(total, what, show):
    """A tqdm bar on stderr when shown, else a stand-in that does nothing."""
    from tqdm import tqdm
    return tqdm(total=total, desc=what, leave=False, file=sys.stderr, disable=not show, mininterval=1)
