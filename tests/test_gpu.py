"""The CUDA paths, on a GPU only (skipped elsewhere; `.ci/gpu` runs them with the recipes and the benchmark):
bf16 and fp16 + GradScaler training, torch.compile, fused AdamW, flash SDPA with and without GQA, the SDPA
backend torch picks (with a window mask) against math, cached sampling, decoding as a CUDA graph, the fused
grouped matmul of MoE (and the loop at widths it cannot read), FSDP in bf16 and fp16, and flash-linear-attention's
kernels for the 'D', 'K' and 'S' layers where it is installed."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import model as M
from chapters import deltanet, moe  # noqa: E402
from conftest import make_char_dataset
from chapters import GPT, GPTConfig

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')]
REPO = Path(__file__).resolve().parents[1]
TINY = ['--dataset=tiny', '--device=cuda', '--n_layer=2', '--n_head=4', '--n_embd=64', '--block_size=32',
        '--batch_size=8', '--gradient_accumulation_steps=1', '--eval_iters=2', '--log_interval=1',
        '--learning_rate=3e-3', '--warmup_iters=2', '--max_iters=20', '--eval_interval=10']
MODERN = ['--norm=rms', '--mlp=swiglu', '--n_kv_head=2', '--pos=rope']


def train(cwd, *args, launcher=None):
    result = subprocess.run((launcher or [sys.executable]) + [str(REPO / 'train.py'), *TINY, *args], cwd=cwd,
                            capture_output=True, text=True, timeout=600, env={**os.environ, 'WANDB_MODE': 'offline'})
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def val_losses(out):
    import json
    return [json.loads(line)['val_loss'] for line in (out / 'log.jsonl').read_text().splitlines()]


@pytest.mark.parametrize('dtype', ['bfloat16', 'float16'])
@pytest.mark.parametrize('compile', [False, True])
def test_mixed_precision_training_learns(tmp_path, dtype, compile):
    make_char_dataset(tmp_path)
    result = train(tmp_path, *MODERN, f'--dtype={dtype}', f'--compile={compile}', '--out_dir=out')
    assert f'dtype {dtype}, compile {compile}' in result.stdout
    losses = val_losses(tmp_path / 'out')
    assert losses[-1] < losses[0] - 0.5


def test_compiled_training_matches_eager(tmp_path):
    make_char_dataset(tmp_path)
    for compile in (False, True):
        train(tmp_path, *MODERN, '--dtype=float32', f'--compile={compile}', f'--out_dir=out{int(compile)}')
    eager, compiled = val_losses(tmp_path / 'out0'), val_losses(tmp_path / 'out1')
    assert compiled == pytest.approx(eager, rel=5e-3)  # TF32 matmuls in both, fused differently


def test_fused_adamw_on_cuda():
    model = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=32)).cuda()
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cuda')
    assert optimizer.defaults.get('fused') is True


@pytest.mark.parametrize('n_kv_head', [None, 2, 1])
def test_flash_attention_runs_and_matches_math(n_kv_head):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=64, vocab_size=64, n_layer=2, n_head=4, n_embd=64, n_kv_head=n_kv_head,
                          pos='rope', norm='rms')).cuda().eval()
    idx = torch.randint(0, 64, (2, 64), device='cuda')
    with torch.no_grad(), torch.autocast('cuda', dtype=torch.bfloat16):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            flash = model(idx)[0].float()
        with sdpa_kernel(SDPBackend.MATH):
            math = model(idx)[0].float()
    torch.testing.assert_close(flash, math, atol=5e-2, rtol=0)


@pytest.mark.parametrize('n_kv_head', [8, 2])
@pytest.mark.parametrize('window', [None, 48], ids=['causal', 'sliding-window-mask'])
def test_the_backend_torch_picks_matches_math_in_values_and_gradients(window, n_kv_head):
    """No backend forced, as training runs (on Hopper cuDNN may win over flash): bf16 outputs and q, k, v
    gradients against the math backend in fp32, at a length of 64 mod 128 (192), with the causal flag and
    with the explicit boolean mask a sliding window passes."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.manual_seed(0)
    T = 192
    q = torch.randn(2, 8, T, 64, device='cuda')
    k, v = torch.randn(2, 2, n_kv_head, T, 64, device='cuda').unbind(0)
    mask = M.causal_mask(T, window, 'cuda')
    mask = True if mask is None else mask
    r = torch.randn(2, 8, T, 64, device='cuda')

    def run(dtype):
        inputs = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        out = M.attend(*inputs, mask)
        (out.float() * r).sum().backward()
        return [out.float()] + [t.grad.float() for t in inputs]
    picked = run(torch.bfloat16)
    with sdpa_kernel(SDPBackend.MATH):
        reference = run(torch.float32)
    for name, got, want in zip(('out', 'dq', 'dk', 'dv'), picked, reference):
        assert torch.isfinite(got).all(), name
        torch.testing.assert_close(got, want, atol=3e-2 * want.abs().max().item(), rtol=0, msg=name)


@pytest.mark.parametrize('flags', [dict(), dict(norm='rms', mlp='swiglu', n_kv_head=2, pos='rope'),
                                   dict(norm='rms', pos='rope', attn='mla'), dict(norm='rms', pos='rope', mlp='moe')],
                         ids=['vanilla', 'modern', 'mla', 'moe'])
def test_cached_sampling_on_cuda_equals_uncached(flags):
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=32, vocab_size=64, n_layer=2, n_head=4, n_embd=64, **flags)).cuda().eval()
    prompt = torch.randint(0, 64, (3, 5), device='cuda')
    cached = model.generate(prompt, 60, temperature=0.0, use_cache=True)
    uncached = model.generate(prompt, 60, temperature=0.0, use_cache=False)
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize('flags', [dict(norm='rms', mlp='swiglu', n_kv_head=2, pos='rope'),
                                   dict(norm='rms', pos='rope', attn='mla', layers='LG', sliding_window=8)],
                         ids=['modern', 'mla+window'])
def test_decoding_as_a_cuda_graph_equals_eager(flags):
    """compile_decoding on CUDA: the step replayed as a CUDA graph (reduce-overhead) over one kept cache; the
    tokens of eager decoding, in fp32, at two lengths past a context shift, from one graph."""
    import torch._dynamo
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=32, vocab_size=64, n_layer=2, n_head=4, n_embd=64, **flags)).cuda().eval()
    prompt = torch.randint(0, 64, (3, 5), device='cuda')
    eager = {n: model.generate(prompt, n, temperature=0.0) for n in (10, 60)}
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        model.compile_decoding()
        for n, expected in eager.items():
            assert torch.equal(model.generate(prompt, n, temperature=0.0), expected)
        assert torch._dynamo.utils.counters['stats']['unique_graphs'] == 1
        assert not torch._dynamo.utils.counters['inductor'].get('cudagraph_skips')
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize('hidden', [344, 341])
@pytest.mark.parametrize('autocast', [True, False], ids=['fp32-weights-under-bf16-autocast', 'bf16-weights'])
def test_moe_grouped_matmul_kernel_equals_the_loop(monkeypatch, autocast, hidden):
    """As training runs it (fp32 weights, bf16 autocast), and with bf16 weights; at an expert width of a
    multiple of 8 the grouped matmul runs, at 341 (1024 // 3) it cannot read the rows and the loop runs."""
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=32, vocab_size=64, n_layer=1, n_head=4, n_embd=64, mlp='moe', n_expert=8,
                    moe_hidden=hidden)
    layer = moe.MoE(cfg).cuda()
    x = torch.randn(4, 32, 64, device='cuda')
    if not autocast:
        layer, x = layer.to(torch.bfloat16), x.to(torch.bfloat16)
    with torch.autocast('cuda', dtype=torch.bfloat16, enabled=autocast):
        assert moe._fused_grouped_mm(x, (64, hidden)) is (hidden % 8 == 0)
        fused = layer(x)
        r = torch.randn_like(fused.float())  # a gradient that is not the same everywhere
        (fused.float() * r).sum().backward()
        grads = [p.grad.clone() for p in (layer.experts.c_fc, layer.experts.c_proj)]
        layer.zero_grad()
        monkeypatch.setattr(moe, '_fused_grouped_mm', lambda *_: False)
        looped = layer(x)
        (looped.float() * r).sum().backward()
    torch.testing.assert_close(fused.float(), looped.float(), atol=2e-2, rtol=2e-2)
    for g, p in zip(grads, (layer.experts.c_fc, layer.experts.c_proj)):
        torch.testing.assert_close(g.float(), p.grad.float(), atol=2e-2 * p.grad.abs().max().item(), rtol=0)


@pytest.mark.parametrize('dtype', ['bfloat16', 'float16'])  # float16: with the sharded grad scaler
def test_fsdp_on_one_process_with_nccl(tmp_path, dtype):
    make_char_dataset(tmp_path)
    launcher = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=1']
    result = train(tmp_path, *MODERN, '--fsdp=True', f'--dtype={dtype}', '--out_dir=out', launcher=launcher)
    assert 'sharded (FSDP)' in result.stdout
    losses = val_losses(tmp_path / 'out')
    assert losses[-1] < losses[0] - 0.5


@pytest.mark.parametrize('layers', ['DG', 'KG', 'SG'])
def test_fla_kernels_match_the_pytorch_forms(monkeypatch, layers):
    """flash-linear-attention's kernels (where installed) against the PyTorch forms on the same CUDA model:
    logits and gradients in fp32, and cached decoding after a prefill through them. Triton's fp32 dots may run
    in TF32, hence the tolerance; the figures are printed."""
    pytest.importorskip('fla')
    assert deltanet.fla_ops() is not None, 'fla is importable but its chunked kernels are not where FLA_OPS looks'
    chunk = {'ssm_chunk_size': 64} if layers == 'SG' else {'linear_chunk_size': 64}
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=128, block_size=256, vocab_size=96, layers=layers, norm='rms',
                          mlp='swiglu', pos='rope', **chunk)).cuda()
    idx = torch.randint(0, 96, (2, 200), device='cuda')
    results = {}
    for use in (True, False):
        monkeypatch.setattr(deltanet, 'USE_FLA', use)
        model.zero_grad()
        logits, loss = model(idx, targets=idx)
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        with torch.no_grad():
            tokens = model.generate(idx[:, :150], 20, temperature=0)
        results[use] = (logits.detach(), grads, tokens)
    (logits, grads, tokens), (ref_logits, ref_grads, ref_tokens) = results[True], results[False]
    logit_err = (logits - ref_logits).abs().max().item()
    grad_err = ((grads - ref_grads).norm() / ref_grads.norm()).item()
    print(f"{layers}: fla vs PyTorch: logits max |diff| {logit_err:.2e}, gradients relative {grad_err:.2e}, "
          f"greedy tokens equal {torch.equal(tokens, ref_tokens)}")
    assert logit_err < 5e-3 and grad_err < 5e-3
    assert (tokens == ref_tokens).float().mean() > 0.9  # a near-tie may part the greedy rows
    monkeypatch.setattr(deltanet, 'USE_FLA', True)  # train.py compiles the model: the kernels run beside the graph
    compiled_logits, _ = torch.compile(model)(idx, targets=idx)
    assert (compiled_logits.detach() - logits).abs().max().item() < 5e-3
