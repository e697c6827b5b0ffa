"""train.py's batches of data/<dataset>/: windows of text drawn uniformly over the tokens of every shard, or a task
dataset's whole examples with the targets it does not score at -1; each batch sent to the device once."""

import os

import numpy as np
import torch

from common.data import example_split, read_examples, split_files
from common.errors import die


def train_generator(seed, it, micro):
    """Batches depend only on (seed, iteration, global micro step): resume is exact, and N processes draw
    exactly the batches one process would with the same global gradient_accumulation_steps."""
    return torch.Generator().manual_seed(hash((seed, it, micro)) & (2 ** 63 - 1))


def task_eval_splits(meta, meta_path):
    """A task dataset's splits to evaluate, meta.json's eval_splits (default ['val']): a list of split names that
    holds 'val', the split every evaluation saves by; anything else is one line."""
    splits = meta.get('eval_splits') or ['val']
    if isinstance(splits, str):
        die(f"'{meta_path}' has eval_splits {splits!r}, a string: it must be a list of split names, e.g. "
            f"[{splits!r}]; rerun its prepare.py")
    if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
        die(f"'{meta_path}' has eval_splits {splits!r}: it must be a list of split names, e.g. ['val', 'val_2x']; "
            f"rerun its prepare.py")
    if 'val' not in splits:
        die(f"'{meta_path}' has eval_splits {splits} without 'val', the split every evaluation saves by: add 'val' "
            f"to it, or rerun its prepare.py")
    return list(splits)


class Batches:
    """The splits of data/<dataset> as (x, y) batches of batch_size rows on device. A task dataset (meta.json has
    example_length: data/recall, data/copy) holds whole examples, a mask of the scored targets, and eval_splits to
    evaluate at other lengths; its rows are examples, aligned. block_size and vocab_limit are the model's: set them
    once it is built."""

    def __init__(self, dataset, meta, meta_path, batch_size, block_size, device):
        self.data_dir = os.path.join('data', dataset)
        self.example_data = 'example_length' in meta
        self.eval_splits = task_eval_splits(meta, meta_path) if self.example_data else ['val']
        if self.example_data and isinstance(meta.get('shards'), dict):
            die(f"'{meta_path}' has both example_length and shards: a task dataset is one file per split; rerun its "
                f"prepare.py")
        # a task's (examples, example_length) per split
        self.example_shape = {split: example_split(self.data_dir, split, meta) for split in ('train', *self.eval_splits)} \
            if self.example_data else {}
        self.shard_files = {split: split_files(dataset, meta, split) for split in ('train', 'val')}
        self.split_tokens = {split: [os.path.getsize(p) // 2 for p in files] for split, files in self.shard_files.items()}
        self.batch_size, self.block_size, self.device = batch_size, block_size, device
        self.vocab_limit = None

    def get(self, split, generator, fetch=True):
        """(x, y) on the device; fetch=False only draws the batch's offsets (the generator moves alike) -> None.
        Over shards, every window of every shard is equally likely (uniform by tokens): one draw over them all.
        A task dataset's rows are whole examples, x and y within one, y -1 where not scored."""
        if self.example_data:
            rows = torch.randint(self.example_shape[split][0], (self.batch_size,), generator=generator).tolist()
            return self.examples(split, rows) if fetch else None
        # each shard's windows, one after another: one file's draws are those of the single file they always were
        starts = [max(0, n - self.block_size) for n in self.split_tokens[split]]
        ix = torch.randint(sum(starts), (self.batch_size,), generator=generator).tolist()
        if not fetch:
            return None
        rows, files, ends = [], [], np.cumsum(starts)
        for i in ix:
            k = int(np.searchsorted(ends, i, side='right'))
            files.append(self.shard_files[split][k])
            # a fresh memmap per batch: numpy keeps a long-lived one's pages and memory grows
            data = np.memmap(self.shard_files[split][k], dtype=np.uint16, mode='r')
            offset = i - (ends[k - 1] if k else 0)
            rows.append(data[offset:offset + 1 + self.block_size])
        xy = np.stack(rows).astype(np.int64)
        self.check_token_ids(xy, files[int(xy.max(axis=1).argmax())])
        xy = self.to_device(xy)  # one contiguous (B, T+1) block; inputs and targets are its views on the device
        return xy[:, :-1], xy[:, 1:]

    def examples(self, split, rows):
        """(x, y) of the split's examples at indices rows, on the device."""
        x, y = read_examples(self.data_dir, split, rows, self.example_shape[split][1])
        self.check_token_ids(np.maximum(x, y), os.path.join(self.data_dir, f'{split}.bin'))
        xy = self.to_device(np.stack((x, y)))
        return xy[0], xy[1]

    def check_token_ids(self, tokens, path):
        if tokens.max() >= self.vocab_limit:
            die(f"'{path}' holds token id {tokens.max()} but the model's vocabulary has {self.vocab_limit}: the data "
                f"and meta.json (or the model) do not belong together")

    def to_device(self, array):
        """A numpy array pinned and sent once."""
        tensor = torch.from_numpy(array)
        return tensor.pin_memory().to(self.device, non_blocking=True) if self.device.startswith('cuda') \
            else tensor.to(self.device)

    def row_tokens(self):
        """The tokens a training row trains on: a task's examples may be shorter than block_size (their inputs)."""
        return self.example_shape['train'][1] - 1 if self.example_data else self.block_size

    def check_fit(self, length):
        """Each split needs a file longer than one window of length tokens; a task dataset's block_size must hold
        its training and val examples (their inputs: one token shorter)."""
        if self.example_data:
            longest = max(self.example_shape['train'][1], self.example_shape['val'][1])
            if length < longest - 1:
                die(f"block_size {length} is shorter than the examples of {self.data_dir} ({longest} tokens: inputs "
                    f"of {longest - 1}); set --block_size={longest - 1}")
            return
        for split in ('train', 'val'):
            tokens = max(self.split_tokens[split])
            if tokens <= length:
                die(f"'{self.shard_files[split][self.split_tokens[split].index(tokens)]}' holds {tokens} tokens, too "
                    f"few for block_size {length}")
