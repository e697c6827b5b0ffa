# GPT-2 block on character-level Shakespeare: nanoGPT's shakespeare_char recipe (one GPU, a few minutes)
out_dir = 'out-shakespeare-vanilla'
eval_interval = 250  # small data: evaluate often, it overfits
eval_iters = 200
log_interval = 10
always_save_checkpoint = False  # keep the best model only
wandb_project = 'shakespeare-char'
wandb_run_name = 'vanilla'

dataset = 'shakespeare_char'
gradient_accumulation_steps = 1
batch_size = 64
block_size = 256  # 256 characters of context

n_layer = 6
n_head = 6
n_embd = 384
dropout = 0.2

learning_rate = 1e-3  # a small model can take a higher rate
max_iters = 5000
lr_decay_iters = 5000
min_lr = 1e-4
beta2 = 0.99  # few tokens per iteration
warmup_iters = 100
