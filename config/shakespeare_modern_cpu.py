# the CPU recipe with the four modern swaps
exec(open('config/shakespeare_vanilla_cpu.py').read())
out_dir = 'out-shakespeare-modern-cpu'
wandb_run_name = 'modern'

norm = 'rms'
mlp = 'swiglu'
n_kv_head = 2  # 4 query heads share 2 K/V heads
pos = 'rope'
