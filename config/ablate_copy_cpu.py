# The length_generalization group on a 2-core CPU: trained on strings of 1..16 symbols, evaluated at 16,
# 32 and 64 (2x, 4x the training inputs): learned positions, RoPE (plain and each scaling), NoPE, a NoPE layer in
# four, RoPE on a quarter of each head.
#   python data/copy/prepare.py
#   python ablate.py config/ablate_copy_cpu.py
out_dir = 'out-ablate-copy'
train_config = 'config/copy_cpu.py'
grid = 'length_generalization'
seeds = 3
extrapolation = 'plain,linear,dynamic,yarn'
parallel = 2
