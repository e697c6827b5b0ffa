# Ablation of the four swaps on character-level Shakespeare with nanoGPT's CPU recipe
# (4 layers, 4 heads, 128 wide, block 64, batch 12, 2000 iters, dropout 0, eval_iters 20):
#   python data/shakespeare_char/prepare.py     # once
#   python ablate.py config/ablate_shakespeare_char.py
# The default grid is 6 variants (vanilla, vanilla+rms, +swiglu, +gqa, +rope, modern), one seed each. A run (the
# quick start's, for modern) took about 80 s on a quiet 2-core AMD EPYC (31-38 ms/iter; 18 runs in about 24
# minutes: docs/results.md) and 5.3 minutes on a busy 2-core machine (modern, 206 ms/iter, load average 4-7,
# 1 thread): 8 to 32 minutes for the grid. Finished runs are kept, so more can be added later and only the new
# runs train, e.g.
#   python ablate.py config/ablate_shakespeare_char.py --seeds=3                   # seeds 1338 and 1339 too
#   python ablate.py config/ablate_shakespeare_char.py --grid=default,leave_one_out,mlp
#   python ablate.py config/ablate_shakespeare_char.py --grid=default,kv --n_kv_heads=1,2,4
#   python ablate.py config/ablate_shakespeare_char.py --grid=default,custom \
#       --custom="{'rope_theta500': {'pos': 'rope', 'rope_theta': 500.0}}"
# The next swaps, each in an out_dir of its own (the README's Results; 3 seeds, 2 for stability):
#   python ablate.py config/ablate_shakespeare_char.py --grid=moe --seeds=3 --out_dir=out-ablate-moe
#   python ablate.py config/ablate_shakespeare_char.py --grid=attention --seeds=3 --out_dir=out-ablate-attention
#   python ablate.py config/ablate_shakespeare_char.py --grid=long_context --seeds=3 --out_dir=out-ablate-long \
#       --extrapolation=plain,linear,dynamic,yarn,window
#   python ablate.py config/ablate_shakespeare_char.py --grid=stability --seeds=2 --out_dir=out-ablate-stability
# A quick smoke test of the whole pipeline: --train_args='--max_iters=20 --eval_interval=10' --out_dir=out-smoke
out_dir = 'out-ablate-shakespeare-char'
train_config = 'config/shakespeare_vanilla_cpu.py'
grid = 'default'
seeds = 1
