# GPT-2 (124M) on 10B tokens of FineWeb-Edu, the build-nanogpt / llm.c recipe, HellaSwag scored as it trains:
#   python data/fineweb_edu/prepare.py          # sample-10BT: ~10B GPT-2 tokens, ~20 GB of shards
#   pip install lm-eval                          # for eval_task
#   torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_fineweb.py
# 2**19 = 524,288 tokens per iteration: 16 batch * 1024 block * 32 accumulation steps (4 per GPU on 8; one GPU
# runs all 32, the same recipe, 8x slower); 19,073 iterations are the 10B tokens, one epoch
wandb_log = True
wandb_project = 'fineweb'
wandb_run_name = 'gpt2-124M-fineweb'
out_dir = 'out-gpt2-fineweb'
dataset = 'fineweb_edu'

batch_size = 16
block_size = 1024
gradient_accumulation_steps = 32

learning_rate = 6e-4
min_lr = 6e-5
warmup_iters = 715
max_iters = 19073
lr_decay_iters = 19073
weight_decay = 0.1
eval_interval = 250
eval_iters = 80  # 80 * 16 * 1024: ~1.3M val tokens, as build-nanogpt
log_interval = 10

# HellaSwag at every evaluation, on rank 0 (the other GPUs wait for it): 2000 of its 10,042 items keep that
# short with a standard error near 1%; eval_task_limit = 0 scores all of them, as published numbers do
eval_task = 'hellaswag'
eval_task_limit = 2000
eval_task_fewshot = 0
