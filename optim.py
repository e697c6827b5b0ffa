"""
The optimizers GPT.configure_optimizers gives: AdamW on every parameter, or Muon on the blocks' hidden
matrices beside an AdamW on the rest (MuonAdamW, stepped, saved and loaded as one optimizer).
"""

import inspect
from functools import partial

import torch


def configure_optimizers(model, weight_decay, learning_rate, betas, device_type, optimizer='adamw', muon_lr=0.02,
                         muon_momentum=0.95, fused=True):
    """AdamW on every parameter; optimizer='muon': Muon on the blocks' hidden matrices (each expert of a
    stack a matrix of its own) and AdamW on the rest: embeddings, the head, norms, biases, scalars and
    convolution kernels, which are not matrices a layer multiplies its input by (the speedrun, Moonlight).
    fused: AdamW's fused kernel on CUDA; False for FSDP's sharded fp16 scaler, whose found-inf flag (shape
    [1]) the fused step cannot take (pytorch#140514; seen on an H200 with torch 2.11)."""
    params = [p for p in model.parameters() if p.requires_grad]
    hidden = set()
    if optimizer == 'muon':
        # a module's stacks of matrices (an MoE's experts: matrix_stacks) go to Muon as one matrix each
        stacks = {id(p) for m in model.modules() if hasattr(m, 'matrix_stacks') for p in m.matrix_stacks()}
        hidden = {id(p) for p in model.transformer.h.parameters() if p.requires_grad and
                  (p.dim() == 2 or id(p) in stacks)}
    rest = [p for p in params if id(p) not in hidden]
    # matrices and embeddings decay; biases and norm gains do not
    groups = [{'params': [p for p in rest if p.dim() >= 2], 'weight_decay': weight_decay},
              {'params': [p for p in rest if p.dim() < 2], 'weight_decay': 0.0}]
    fused = fused and device_type == 'cuda' and 'fused' in inspect.signature(torch.optim.AdamW).parameters
    adamw = torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **({'fused': True} if fused else {}))
    if optimizer == 'adamw':
        return adamw
    return MuonAdamW([p for p in params if id(p) in hidden], adamw, lr=muon_lr, momentum=muon_momentum,
                     weight_decay=weight_decay)


def _link_grads(views, stack):
    for view, grad in zip(views, stack.grad.unbind(0)):
        view.grad = grad


class MuonAdamW:
    """torch.optim.Muon on the hidden matrices beside an AdamW on the rest, stepped, zeroed, saved and loaded
    as one optimizer; param_groups lists both (Muon's groups are the ones with 'ns_steps').

    Muon orthogonalizes 2-D updates; a stack of experts (E, A, B) goes to it as E matrices, views of the stack
    whose gradients are linked to the stack's each time it accumulates one."""

    def __init__(self, hidden, adamw, **muon_settings):
        matrices, self.stacks = [], []
        for p in hidden:
            if p.dim() == 2:
                matrices.append(p)
                continue
            views = list(p.detach().unbind(0))  # leaves sharing the stack's memory: Muon's updates land in it
            p.register_post_accumulate_grad_hook(partial(_link_grads, views))
            matrices += views
            self.stacks.append(p)
        self.adamw, self.muon = adamw, torch.optim.Muon(matrices, **muon_settings)

    @property
    def param_groups(self):
        return self.adamw.param_groups + self.muon.param_groups

    def step(self):
        self.adamw.step()
        self.muon.step()

    def zero_grad(self, set_to_none=True):
        self.adamw.zero_grad(set_to_none)
        self.muon.zero_grad(set_to_none)
        for p in self.stacks:
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad.zero_()

    def state_dict(self):
        return {'adamw': self.adamw.state_dict(), 'muon': self.muon.state_dict()}

    def load_state_dict(self, state):
        if set(state) != {'adamw', 'muon'}:
            raise ValueError("the optimizer state is not Muon's and AdamW's (the run was trained with another optimizer)")
        self.adamw.load_state_dict(state['adamw'])
        self.muon.load_state_dict(state['muon'])

