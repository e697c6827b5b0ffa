# the GPT-2 (124M) FineWeb-Edu recipe with LLaMA-style blocks:
#   torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_fineweb_modern.py
exec(open('config/train_gpt2_fineweb.py').read())
wandb_run_name = 'gpt2-124M-fineweb-modern'
out_dir = 'out-gpt2-fineweb-modern'

norm = 'rms'
mlp = 'swiglu'  # 8/3 * 768 = 2048 hidden: the same parameter count as the 4x GELU MLP
n_kv_head = 6  # 12 query heads share 6 K/V heads: half the KV cache
pos = 'rope'
