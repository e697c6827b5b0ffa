# fine-tune pretrained GPT-2 XL on Shakespeare (BPE tokens):
#   python data/shakespeare/prepare.py && python train.py config/finetune_shakespeare.py
out_dir = 'out-shakespeare'
eval_interval = 5
eval_iters = 40
wandb_project = 'shakespeare'
wandb_run_name = 'ft-gpt2-xl'

dataset = 'shakespeare'
init_from = 'gpt2-xl'  # the largest GPT-2; any GPT-2 or Llama name/directory works
always_save_checkpoint = False  # keep the best only: it overfits fast

# 1 batch * 32 accumulation * 1024 tokens = 32,768 tokens per iteration; 300k tokens = ~9 iterations per epoch
batch_size = 1
gradient_accumulation_steps = 32
max_iters = 20

learning_rate = 3e-5  # fine-tune at a constant small rate
decay_lr = False
