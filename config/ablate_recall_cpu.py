# The recall group on a 2-core CPU: Zoology's accuracy against width, for all global, the 3:1 Gated
# DeltaNet hybrid, all Gated DeltaNet, all local windows (a quarter of L) and MLA; 3 seeds, two runs at a time:
#   python data/recall/prepare.py --seq_len 32 --num_pairs 4 --vocab_size 64 --out_dir data/recall_32
#   python ablate.py config/ablate_recall_cpu.py
# One length (32 tokens, 4 pairs) fits this CPU: at 64 tokens and 8 pairs global attention 64 wide was still at
# 0.35 accuracy after 1,750 of 3,000 iterations (one seed, ~75 ms/iter), so a second length needs far more
# iterations per run (docs/results.md). Add one with --recall_lengths=32,64 and its prepare command.
# A second pair count at the same length (the state's load, not the distance), as docs/results.md ran it:
#   python data/recall/prepare.py --seq_len 32 --num_pairs 8 --vocab_size 64 --out_dir data/recall_32_p8
#   python ablate.py config/ablate_recall_cpu.py --recall_widths=64 --recall_pairs=8 \
#       --recall_archs=global,DDDG,VVVG,D,V,SSSG,S,KKKG,K
# Zoology's protocol: each point at 2 and 4 layers and three learning rates, the best rate reported;
# global attention at 8 pairs, as docs/results.md ran it (18 runs, one at a time: about 75 minutes here; then
# --recall_archs=global,DDDG --recall_depths=2 adds the 1:1 hybrid DG, 9 runs more):
#   python ablate.py config/ablate_recall_cpu.py --recall_widths=64 --recall_pairs=8 --recall_archs=global \
#       --recall_depths=2,4 --recall_lrs=3e-4,1e-3,3e-3 --out_dir=out-ablate-recall-zoology
# then each other architecture at 2 layers (--recall_archs=DDDG, KKKG, VVVG, SSSG, D, S, V, L, K, mla, one invocation
# each, 9 runs, 13-50 min two at a time), and global at 2 layers and 1e-3 with 6,000 iterations, where every seed learns it:
#   ... --recall_depths=2 --recall_lrs=1e-3 --out_dir=out-ablate-recall-zoology-6k \
#       "--train_args=--max_iters=6000 --lr_decay_iters=6000"
# 4 pairs (--recall_pairs=4) at 2 and 4 layers, 64 tokens (--recall_lengths=64) at 2: docs/results.md,
# "Zoology's protocol".
out_dir = 'out-ablate-recall'
train_config = 'config/recall_cpu.py'
grid = 'recall'
seeds = 3
recall_widths = '32,64'
recall_lengths = '32'
extrapolation = ''  # recall's yardstick is accuracy on its own examples, not longer windows
parallel = 2
