# The recall group's base recipe on a CPU (ablate.py sets dataset, block_size, n_embd and n_head per run): 4 layers
# (room for the 3:1 hybrid 'DDDG'), batch 64 whole examples, AdamW at 1e-3 (3e-3 plateaued at 4 pairs in the pilot,
# docs/evidence_plan.md; at 8 pairs it is global attention's best rate at 4 layers: docs/results.md), 3000
# iterations: past the phase change where global attention goes from ~0.3 to ~1.0 accuracy, which comes at another
# iteration run to run. Where it came, at width 64 on data/recall_32: between 500 and 750 with the modern block
# (docs/training.md's command; 0.31 at 500, 0.86 at 750, 0.97 at 1,250, 1.000 at 2,500, one run on a 2-core CPU,
# and so in a second run); past 0.9 at 1,000-1,500 in the recall group's three seeds (docs/results.md);
# 2,200-2,600 in the pilot before this recipe (docs/evidence_plan.md).
# At 8 pairs it comes later, if at all: 2,500-2,750 where it came, at 2 or 4 layers, and which seeds cross depends
# on the rate (none of three at 4 layers and 1e-3, two at 3e-3: docs/results.md, "Zoology's protocol"); at 2 layers
# and 1e-3 with max_iters=6000 every seed crossed, at 2,000-4,500.
exec(open('config/shakespeare_vanilla_cpu.py').read())
out_dir = 'out-recall-cpu'
wandb_project = 'recall'
dataset = 'recall_32'
block_size = 31
n_layer = 4
n_head = 2
n_embd = 64
batch_size = 64
learning_rate = 1e-3
min_lr = 1e-4
max_iters = 3000
lr_decay_iters = 3000
warmup_iters = 100
eval_interval = 250
eval_iters = 16  # 16 x 64 = 1,024 fixed val examples: accuracy steady to about +-0.01
log_interval = 250
# a run ends once solved (the first evaluation at 0.99 accuracy or more): the rest of its 3,000 iterations would
# only read 1.000 again. From the Zoology-protocol grid on; runs before it trained to 3,000 whatever their accuracy
stop_accuracy = 0.99
