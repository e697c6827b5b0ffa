# GPT-2 (124M) on OpenWebText, 8 GPUs on one node:
#   torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2.py
# ~0.5M tokens per iteration: 12 batch * 1024 block * 40 accumulation steps (5 per GPU)
wandb_log = True
wandb_project = 'owt'
wandb_run_name = 'gpt2-124M'
out_dir = 'out-gpt2'
dataset = 'openwebtext'

batch_size = 12
block_size = 1024
gradient_accumulation_steps = 5 * 8

max_iters = 600000  # 300B tokens
lr_decay_iters = 600000
eval_interval = 1000
eval_iters = 200
log_interval = 10
weight_decay = 1e-1
