"""Training FLOPs as torch's FlopCounterMode counts them: its own formulas per operator, not our token_flops."""

import torch
from torch.utils.flop_counter import FlopCounterMode, register_flop_formula, sdpa_backward_flop, sdpa_flop

_aten = torch.ops.aten
# torch 2.x counts attention's flash kernels on CUDA but not the CPU one F.scaled_dot_product_attention picks there,
# which it would count as 0: the same formulas for it (every key, as the CUDA kernels are counted)
if _aten._scaled_dot_product_flash_attention_for_cpu.default not in torch.utils.flop_counter.flop_registry:
    register_flop_formula(_aten._scaled_dot_product_flash_attention_for_cpu)(
        lambda query, key, value, *args, out_shape=None, **kwargs: sdpa_flop(query, key, value))
    register_flop_formula(_aten._scaled_dot_product_flash_attention_for_cpu_backward)(
        lambda grad_out, query, key, value, *args, out_shape=None, **kwargs:
        sdpa_backward_flop(grad_out, query, key, value))


def training_flops(model, x, y, autocast=None):
    """FLOPs of one forward and backward of model(x, y) (its loss), as FlopCounterMode counts them; the gradients
    are cleared after."""
    with FlopCounterMode(display=False) as counter:
        with autocast or torch.autocast('cpu', enabled=False):
            _, loss = model(x, y)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()
