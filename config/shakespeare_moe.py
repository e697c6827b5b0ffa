# the modern block with a mixture of experts in place of its SwiGLU (one GPU, a few minutes):
#   python train.py config/shakespeare_moe.py
# 8 experts of half the SwiGLU width, 2 per token: the same active parameters as the dense modern block,
# 4x its MLP parameters in total. Softmax router (Mixtral) with Switch's load-balancing loss.
exec(open('config/shakespeare_modern.py').read())
out_dir = 'out-shakespeare-moe'
wandb_run_name = 'moe'

mlp = 'moe'
n_expert = 8
n_expert_active = 2
router = 'softmax'
moe_aux_loss_coef = 0.01
