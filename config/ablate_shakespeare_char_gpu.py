# Ablation of the four swaps on character-level Shakespeare with nanoGPT's one-GPU recipe
# (6 layers, 6 heads, 384 wide, block 256, batch 64, 5000 iters, dropout 0.2):
#   python data/shakespeare_char/prepare.py     # once
#   python ablate.py config/ablate_shakespeare_char_gpu.py
# default + leave_one_out is 10 variants (modern is in both, it runs once) x 3 seeds = 30 runs of a few
# minutes each on an A100-class GPU. Add groups or seeds later the same way as in ablate_shakespeare_char.py:
# finished runs are skipped, e.g. --grid=default,leave_one_out,kv --n_kv_heads=1,2,3,6
out_dir = 'out-ablate-shakespeare-char-gpu'
train_config = 'config/shakespeare_vanilla.py'
grid = 'default,leave_one_out'
seeds = 3
