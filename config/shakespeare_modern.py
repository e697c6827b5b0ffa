# LLaMA-style block (RMSNorm, SwiGLU, GQA, RoPE) on the vanilla recipe: only the four swaps differ
exec(open('config/shakespeare_vanilla.py').read())
out_dir = 'out-shakespeare-modern'
wandb_run_name = 'modern'

norm = 'rms'
mlp = 'swiglu'
n_kv_head = 3  # 6 query heads share 3 K/V heads: half the KV cache
pos = 'rope'
