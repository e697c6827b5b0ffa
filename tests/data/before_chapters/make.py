"""How this folder's checkpoints were made: two tiny runs of train.py with several chapters each, on the code from
before the chapters moved out of model.py (commit 5eda1e1, checked out at /tmp/oldrepo), and the logits and greedy
tokens that code computed from them (expected.json). tests/test_old_checkpoints.py loads them with today's code."""
import json, os, subprocess, sys
import numpy as np
sys.path.insert(0, '/tmp/oldrepo')
sys.path.insert(0, '/tmp/oldrepo/tests')
from conftest import make_char_dataset
root = '/tmp/oldckpt/work'
make_char_dataset(root)
common = ['--dataset=tiny', '--device=cpu', '--dtype=float32', '--compile=False', '--max_iters=3', '--eval_interval=3',
          '--eval_iters=1', '--log_interval=1', '--batch_size=2', '--block_size=16', '--n_embd=16', '--n_head=2', '--multiple_of=16',
          '--warmup_iters=1', '--wandb_log=False', '--always_save_checkpoint=True']
RUNS = {
 'linear_moe_mtp_gemma': ['--n_layer=6', "--layers=LDKSVG", '--sliding_window=4', '--rope_local_theta=100.0',
    '--pos=rope', '--norm=rms', '--mlp=moe', '--n_expert=4', '--n_expert_active=2', '--router=sigmoid',
    '--n_shared_expert=1', '--first_dense_layers=1', '--qk_norm=True', '--attn_gate=True', '--attn_sinks=True',
    '--n_kv_head=1', '--mtp_depth=1', '--per_layer_embd=2', '--layer_scalar=True', '--embed_scale=True',
    '--logit_softcap=30.0', '--linear_chunk_size=8', '--ssm_chunk_size=8', '--ssm_state_dim=4'],
 'mla_dsa_nanochat': ['--n_layer=3', '--attn=mla', '--pos=rope', '--norm=rms', '--norm_gain=False', '--embed_norm=True',
    '--mlp=relu2', '--bias=False', '--tie_embeddings=False', '--index_topk=4', '--index_share=FS', '--index_head_dim=8',
    '--q_lora_rank=8', '--zero_init=True', '--rope_scaling=yarn', '--rope_factor=2.0', '--rope_original_length=8'],
}
out = {}
for name, flags in RUNS.items():
    d = f'{root}/out-{name}'
    r = subprocess.run([sys.executable, '/tmp/oldrepo/train.py', *common, *flags, f'--out_dir={d}'], cwd=root,
                       capture_output=True, text=True)
    print(name, r.returncode, r.stderr[-2000:] if r.returncode else r.stdout[-300:])
    import torch
    from model import GPT, GPTConfig
    ck = torch.load(f'{d}/ckpt.pt', map_location='cpu', weights_only=True)
    m = GPT(GPTConfig.from_dict(ck['model_args']))
    m.load_state_dict(ck['model'])
    m.eval()
    idx = torch.arange(20).remainder(ck['model_args']['vocab_size']).view(1, 20)
    with torch.no_grad():
        logits = m(idx)[0]
        gen = m.generate(idx[:, :5], 8, temperature=0)
    out[name] = {'logits_sum': logits.double().sum().item(), 'logits_first': logits[0, :3, :5].tolist(),
                 'logits_last': logits[0, -1, :8].tolist(), 'greedy': gen[0].tolist(), 'iter_num': ck['iter_num']}
json.dump(out, open('/tmp/oldckpt/expected.json', 'w'), indent=1)
print(json.dumps(out)[:500])
