# GPT-2's block on GPT-2's BPE of Shakespeare, on a CPU: the BPE CPU recipe with the four swaps back at GPT-2's
# values (the base recipe ablate.py's BPE groups build on).
#   python data/shakespeare/prepare.py && python train.py config/shakespeare_bpe_vanilla_cpu.py
exec(open('config/shakespeare_bpe_cpu.py').read())
out_dir = 'out-shakespeare-bpe-vanilla-cpu'
wandb_run_name = 'vanilla-cpu'
norm = 'layernorm'
mlp = 'gelu'
n_kv_head = None
pos = 'learned'
