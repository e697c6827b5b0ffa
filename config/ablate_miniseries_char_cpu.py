# The four swaps as a miniseries on character-level Shakespeare, on a CPU: vanilla, each swap alone and modern at
# depths 1-4 (n_embd 32 x depth, heads 16 wide: 32, 64, 96, 128 wide; the 4-layer one is the CPU recipe's width),
# each depth's runs given 8 x vanilla's non-embedding parameters in tokens (12.7k-793k parameters: 0.1M-6.3M
# tokens, 130-8,260 iterations of the recipe's 12 x 64 characters), 3 seeds: 72 runs, two at a time.
#   python data/shakespeare_char/prepare.py     # once
#   python ablate.py config/ablate_miniseries_char_cpu.py
# The ratio is below Chinchilla's 20 to fit about 2 hours on 2 cores (docs/miniseries.md has the figures and the
# time measured); the same grid with --tokens_per_param=20 takes about 2.5 times as long.
out_dir = 'out-miniseries-char'
train_config = 'config/shakespeare_vanilla_cpu.py'
grid = 'default'
seeds = 3
miniseries = '1,2,3,4'
aspect = 32
head_dim = 16  # 2-8 heads: the 1-layer model has two, so GQA there is MQA (one K/V head), not nothing
train_args = '--multiple_of=16'  # SwiGLU's 8/3 x n_embd rounded up to 16, not 64 (at 32 wide, 64 would make it 4x)
tokens_per_param = 8.0
parallel = 2
threads = 1
extrapolation = ''  # the length table is not what a miniseries asks
