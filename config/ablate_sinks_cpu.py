# The sinks group on the CPU recipe (characters, 4 layers, 128 wide, block 64, 2000 iterations), probed:
# the modern block with and without the output gate and learned sinks, and windowed layers with and without sinks.
#   python data/shakespeare_char/prepare.py
#   python ablate.py config/ablate_sinks_cpu.py
out_dir = 'out-ablate-sinks'
train_config = 'config/shakespeare_vanilla_cpu.py'
grid = 'sinks'
seeds = 3
extrapolation = ''
parallel = 2
