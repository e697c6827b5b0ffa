# The speedrun's changes stacked on the CPU modern recipe with Muon (at train.py's muon_lr, 0.02, as the speedrun
# group's modern+muon): the switches whose loss went down alone in that group (3 seeds, docs/chapters/speedrun.md),
# none of the three that went up (the sigmoid cap, the key offset, the Engram memory). Its time to modern+muon's
# final loss is measured beside it:
#   python ablate.py config/ablate_shakespeare_char.py --grid=speedrun,custom --members=modern+muon,stacked \
#       --custom="{'stacked': {'optimizer': 'muon', 'norm': 'rms', 'mlp': 'swiglu', 'n_kv_head': 2, 'pos': 'rope',
#           'value_embed_layers': '0,-1', 'x0_lambdas': True, 'unet_skips': True, 'smear': True, 'backout_layer': 2,
#           'bigram_vocab': 4096, 'xsa_layers': '0,1,2,3', 'mtp_shared': 2}}" \
#       --seeds=3 --train_args=--eval_interval=100 --out_dir=out-ablate-speedrun-stacked
#   python train.py config/speedrun_cpu.py
exec(open('config/shakespeare_modern_cpu.py').read())
out_dir = 'out-speedrun-cpu'
wandb_run_name = 'speedrun'
eval_interval = 100  # the time to a target is read at each evaluation

optimizer = 'muon'
value_embed_layers = '0,-1'  # the first and last layers' values gain a table of their own
x0_lambdas = True  # each block's input mixes in the embeddings
unet_skips = True  # early layers' outputs join the mirrored late layers' inputs
smear = True  # each token's embedding gains a gated share of the previous one's
backout_layer = 2  # the middle layer's output, a learned share, is taken out before the head
bigram_vocab = 4096  # a hashed (previous token, token) table added at every layer
xsa_layers = '0,1,2,3'  # every layer's output loses its projection on the token's own value, a learned share
mtp_shared = 2  # the head also predicts 2 and 3 tokens ahead, the weights fading to 0 by two thirds of training
