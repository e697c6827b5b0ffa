# The modern block on Shakespeare in GPT-2's BPE (tiktoken's 50257 tokens), sized for a CPU: the path to
# FineWeb-Edu, OpenWebText or any tiktoken dataset without a GPU (config/fineweb_edu_cpu.py is the same model
# on FineWeb-Edu). About 0.3M train tokens, so it overfits: the best checkpoint is kept.
#   python data/shakespeare/prepare.py
#   python train.py config/shakespeare_bpe_cpu.py
#   python sample.py --out_dir=out-shakespeare-bpe-cpu --start="ROMEO:"
# 50304 x 128 token embeddings (tied to the head) are 6.4M of its 7.2M parameters, and the head's matmul most of
# a step's ~22 GFLOP (6 x 7.2M x 512 tokens): hence the short context and the small batch.
out_dir = 'out-shakespeare-bpe-cpu'
dataset = 'shakespeare'
device = 'cpu'
compile = False
wandb_project = 'shakespeare-bpe'
wandb_run_name = 'modern-cpu'
always_save_checkpoint = False  # keep the best model only: it overfits
eval_interval = 100
eval_iters = 20
log_interval = 10

batch_size = 8
block_size = 64  # 64 tokens: about 250 characters
gradient_accumulation_steps = 1
n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0

norm = 'rms'
mlp = 'swiglu'
n_kv_head = 2  # 4 query heads share 2 K/V heads
pos = 'rope'

learning_rate = 1e-3  # a small model can take a higher rate
min_lr = 1e-4
beta2 = 0.99  # few tokens per iteration
warmup_iters = 100
max_iters = 1000
lr_decay_iters = 1000
