"""Helpers the scripts share, a module for each thing they hold (import from the module itself):

    common.errors       one-line errors (die), interrupts (catch_interrupts, critical), what an exception is
    common.hardware     device and dtype choice, autocast, fp16's grad scaler, all-reduce, peak FLOP/s
    common.files        tmp paths and atomic writes, an out_dir's lock, log.jsonl, JSON, output refusals
    common.checkpoints  saving and loading checkpoints; the model of a checkpoint or a pretrained name
    common.data         data/<dataset>/: meta.json, a split's token files or shards, a task's examples
    common.tokenizer    tokenizers: a dataset's vocabulary, tiktoken's BPE, Hugging Face's
"""
