# The length_generalization group's base recipe on a CPU: copy a random string of 1..16 symbols (data/copy),
# evaluated at 16, 32 and 64 (val, val_2x, val_4x). ablate.py sets dataset, block_size and the positions.
exec(open('config/shakespeare_vanilla_cpu.py').read())
out_dir = 'out-copy-cpu'
wandb_project = 'copy'
dataset = 'copy'
block_size = 32
n_layer = 4
n_head = 2
n_embd = 64
batch_size = 64
learning_rate = 1e-3
min_lr = 1e-4
max_iters = 2000
lr_decay_iters = 2000
warmup_iters = 100
eval_interval = 250
eval_iters = 16  # 16 x 64 = the first 1,000 examples of each evaluation split, the same every time
log_interval = 250
