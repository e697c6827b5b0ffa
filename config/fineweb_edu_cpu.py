# config/shakespeare_bpe_cpu.py's model (the modern block, 4 layers, 128 wide, GPT-2's BPE) on FineWeb-Edu, on a
# CPU: a first look at the data pipeline and the loss, not GPT-2. A small preparation is enough, e.g. a local
# parquet file (the full sample-10BT is ~20 GB of shards):
#   python data/fineweb_edu/prepare.py --input some.parquet --val_tokens=200000
#   python train.py config/fineweb_edu_cpu.py
exec(open('config/shakespeare_bpe_cpu.py').read())
out_dir = 'out-fineweb-edu-cpu'
dataset = 'fineweb_edu'
wandb_project = 'fineweb'
always_save_checkpoint = True  # web text: no overfitting in these steps
max_iters = 2000
log_interval = 25  # 80 lines a run
lr_decay_iters = 2000
