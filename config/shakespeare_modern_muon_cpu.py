# the CPU modern recipe with Muon on the hidden matrices (AdamW keeps the rest at the recipe's 1e-3), at the
# Muon rate ablate.py's optimizer group measured best of 0.005, 0.01, 0.02, 0.04 (docs/results.md):
#   python ablate.py config/ablate_shakespeare_char.py --grid=optimizer --muon_lrs=0.005,0.01,0.02,0.04
exec(open('config/shakespeare_modern_cpu.py').read())
out_dir = 'out-shakespeare-modern-muon-cpu'
wandb_run_name = 'modern-muon'

optimizer = 'muon'
muon_lr = 0.01
