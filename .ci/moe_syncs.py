"""MoE host synchronisations per training step in bf16 (.ci/gpu): none on the grouped-matmul path (moe_hidden
512); the loop path (341, not a multiple of 8) reads its counts once per layer."""
import collections, torch
from torch.profiler import profile, ProfilerActivity
from model import GPT, GPTConfig
for hidden in (512, 341):
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=256, vocab_size=65, n_layer=4, n_head=8, n_embd=256, norm='rms', pos='rope',
                          mlp='moe', moe_hidden=hidden)).cuda()
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cuda')
    x = torch.randint(0, 65, (8, 256), device='cuda')
    def step():
        with torch.autocast('cuda', dtype=torch.bfloat16):
            loss = model(x, x)[1]
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True); model.update_expert_bias()
    step(); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
    n = collections.Counter(e.name for e in prof.events())
    print(f"moe_hidden {hidden}, per step:", {k: v / 5 for k, v in n.items() if k in (
        'cudaStreamSynchronize', 'cudaDeviceSynchronize', 'aten::_local_scalar_dense', 'aten::item')})
