# the one-GPU modern recipe with Muon on the hidden matrices (AdamW keeps the rest at the recipe's rate); the
# Muon rate is the CPU sweep's best (docs/results.md), not yet swept on a GPU
exec(open('config/shakespeare_modern.py').read())
out_dir = 'out-shakespeare-modern-muon'
wandb_run_name = 'modern-muon'

optimizer = 'muon'
muon_lr = 0.01
