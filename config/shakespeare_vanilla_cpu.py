# nanoGPT's CPU recipe for shakespeare_char: a small model, a few minutes on a laptop
exec(open('config/shakespeare_vanilla.py').read())
out_dir = 'out-shakespeare-vanilla-cpu'
device = 'cpu'
compile = False
eval_iters = 20
log_interval = 25  # 80 lines a run, 10 between evaluations (nanoGPT's 1 printed all 2,000)
block_size = 64
batch_size = 12
n_layer = 4
n_head = 4
n_embd = 128
max_iters = 2000
lr_decay_iters = 2000
dropout = 0.0
