# evaluate the pretrained gpt2-large on OpenWebText: python train.py config/eval_gpt2_large.py
batch_size = 8
eval_iters = 500  # more batches for a steadier estimate
eval_only = True
wandb_log = False
init_from = 'gpt2-large'
dataset = 'openwebtext'
