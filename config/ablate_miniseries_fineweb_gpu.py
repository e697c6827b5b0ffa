# The four swaps as a miniseries on FineWeb-Edu with GPT-2's BPE, on GPUs: depths 4-12 (n_embd 64 x depth, heads
# 64 wide: the 12-layer one is GPT-2 124M's shape), each depth's runs given 20 x vanilla's non-embedding parameters
# in tokens (Chinchilla's ratio: 3.1M-85M parameters, 63M-1.7B tokens), one run a GPU.
#   python data/fineweb_edu/prepare.py     # once (or --input some.parquet)
#   python ablate.py config/ablate_miniseries_fineweb_gpu.py --parallel=8 \
#       --devices=cuda:0,cuda:1,cuda:2,cuda:3,cuda:4,cuda:5,cuda:6,cuda:7
# Estimated (not measured: FLOPs at 40% of an H100's bf16 peak): the 12-layer run about 55 min, each member's five
# depths about 1.5 h, the group (6 members, 1 seed) about 9 GPU-hours; --seeds=3 about 27.
out_dir = 'out-miniseries-fineweb'
train_config = 'config/train_gpt2_fineweb.py'
train_args = '--batch_size=32 --gradient_accumulation_steps=1 --eval_iters=20 --wandb_log=False --eval_task='
grid = 'default'
seeds = 1
miniseries = '4,6,8,10,12'
aspect = 64
head_dim = 64
tokens_per_param = 20.0
extrapolation = ''
