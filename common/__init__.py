"""Helpers the scripts share, a module for each thing they hold (import from the module itself):

    common.errors       one-line errors (die), interrupts (catch_interrupts, critical), what an exception is
    common.hardware     device and dtype choice, autocast, fp16's grad scaler, all-reduce, peak FLOP/s
    common.files        tmp paths and atomic writes, an out_dir's lock, log.jsonl, JSON, output refusals
    common.checkpoints  saving and loading checkpoints; the model of a checkpoint or a pretrained name
    common.data         data/<dataset>/: meta.json, a split's token files or shards, a task's examples
    common.tokenizer    tokenizers: a dataset's vocabulary, tiktoken's BPE, Hugging Face's

train.py's parts, each a unit it reads as one:

    common.batches      a dataset's batches: windows drawn uniformly over its shards, a task's whole examples
    common.evaluation   the evaluation loop: fixed batches per split shared out across ranks, a task's accuracy
    common.schedule     the learning rate's schedule (warmup, then cosine or WSD)
    common.speed        ms/iter, MFU against a peak FLOP/s, the ETA
    common.records      what an evaluation logs: a task's accuracy, wandb's flat keys
    common.resume       an out_dir claimed, a checkpoint resumed, the state gathered for a save
"""
