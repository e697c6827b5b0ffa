# the CPU recipe's modern block with a mixture of experts in place of its SwiGLU:
#   python train.py config/shakespeare_moe_cpu.py
# 8 experts of half the SwiGLU width (192), 2 per token: the dense model's active parameters.
exec(open('config/shakespeare_modern_cpu.py').read())
out_dir = 'out-shakespeare-moe-cpu'
wandb_run_name = 'moe'

mlp = 'moe'
n_expert = 8
n_expert_active = 2
router = 'softmax'
moe_aux_loss_coef = 0.01
