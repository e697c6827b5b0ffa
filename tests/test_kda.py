"""Kimi Linear's shape through train.py (Kimi Delta Attention 'K' layers and MLA without positions): it trains,
and a resumed run continues exactly as one that never stopped, under Muon (the matrices, the low-rank gate
projections among them) and AdamW (the rest: A_log, dt_bias, the convolution, the norms)."""

import torch

from common.checkpoints import load_checkpoint
from test_train import iter_losses, run, workdir  # noqa: F401 (fixtures)

KIMI = ['--layers=KG', '--pos=none', '--attn=mla', '--norm=rms', '--mlp=swiglu', '--bias=False',
        '--linear_chunk_size=5']


def test_a_kda_run_resumes_exactly(workdir, run):  # noqa: F811
    args = [*KIMI, '--optimizer=muon', '--eval_interval=4']
    straight = run(workdir, *args, '--max_iters=8', '--out_dir=a')
    run(workdir, *args, '--max_iters=4', '--out_dir=b')
    resumed = run(workdir, *args, '--max_iters=8', '--out_dir=b', '--init_from=resume')
    a, b = iter_losses(straight.stdout), iter_losses(resumed.stdout)
    assert sorted(b) == list(range(5, 9)) and {k: a[k] for k in b} == b
    assert float(a[8]) < float(a[1])
    final_a = load_checkpoint(str(workdir / 'a' / 'ckpt.pt'))
    final_b = load_checkpoint(str(workdir / 'b' / 'ckpt.pt'))
    assert final_a['model_args']['pos'] == 'none' and final_a['model_args']['layers'] == 'KG'
    for k in final_a['model']:
        assert torch.equal(final_a['model'][k], final_b['model'][k]), k
