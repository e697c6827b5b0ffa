"""ablation/groups.py: each grid group's members on the CPU recipe (the flags they vary, models the recipe builds, at
about equal parameters where they say so); a group whose data is missing is one line."""

import json

import pytest
import torch

from ablation.groups import base_vocab, model_args
from ablation.report import recall_points
from conftest import ablate_grid, ablate_here, make_workdir


def test_groups_are_built_from_the_swap_tables(monkeypatch):
    # the CPU recipe: 4 heads of 32
    _, _, variants = ablate_grid(monkeypatch, '--grid=moe,attention,stability,long_context',
                                 '--learning_rates=1e-3,1e-2')
    modern = variants['modern']
    assert variants['moe'] == {**modern, 'mlp': 'moe', 'n_expert': 8, 'n_expert_active': 2, 'moe_aux_loss_coef': 0.01}
    assert variants['dense-as-total']['ffn_hidden'] == 8 * 192  # 8 experts of half the 384-wide SwiGLU
    assert variants['moe-sigmoid']['router'] == 'sigmoid' and 'moe_aux_loss_coef' not in variants['moe-sigmoid']
    # MLA's cache: latent + rotated key = GQA's 2 K/V heads x 2 x 32 = 128, MQA's 64
    mla = variants['mla-gqa-cache']
    assert mla['attn'] == 'mla' and mla['kv_lora_rank'] + mla['qk_rope_head_dim'] == 128
    assert variants['mla-mqa-cache']['kv_lora_rank'] + variants['mla-mqa-cache']['qk_rope_head_dim'] == 64
    assert variants['modern+qk_norm_lr=0.01'] == {**modern, 'qk_norm': True, 'learning_rate': 0.01, 'min_lr': 0.001}
    assert 'vanilla' in variants and 'mha' in variants and 'mqa' in variants


def test_the_recipe_groups_vary_one_thing_on_the_modern_block(monkeypatch):
    # the CPU recipe: learning_rate 1e-3
    _, base, variants = ablate_grid(monkeypatch, '--grid=schedule,optimizer,recipe_mlp,zero_init',
                                    '--adamw_lrs=1e-3,3e-3', '--muon_lrs=0.02')
    modern = variants['modern']  # adamw lr=1e-3 and modern mlp=swiglu are the recipe's modern: run once
    assert 'adamw_lr=0.001' not in variants and 'modern_mlp=swiglu' not in variants
    assert variants['adamw_lr=0.003'] == {**modern, 'learning_rate': 0.003, 'min_lr': 0.003 / 10}
    assert variants['muon_lr=0.02'] == {**modern, 'optimizer': 'muon', 'muon_lr': 0.02}
    assert variants['modern+wsd'] == {**modern, 'lr_schedule': 'wsd'}
    assert variants['modern_mlp=relu2'] == {**modern, 'mlp': 'relu2', 'ffn_hidden': 576}  # SwiGLU's 384 x 1.5
    assert variants['modern_untied+zero_init'] == {**modern, 'tie_embeddings': False, 'zero_init': True}
    from chapters import GPT, GPTConfig
    mlp_params = lambda flags: sum(p.numel() for p in GPT(GPTConfig(**{**model_args(base), **flags}))
                                   .transformer.h[0].mlp.parameters())
    assert mlp_params(variants['modern_mlp=gelu']) == mlp_params(variants['modern_mlp=relu2']) == mlp_params(modern)


def test_the_per_layer_groups_vary_one_thing_on_the_modern_block(monkeypatch):
    # the CPU recipe: 4 layers, block_size 64
    _, base, variants = ablate_grid(monkeypatch, '--grid=local_global,sinks,gate,nope,norm_position')
    modern, window = variants['modern'], {'sliding_window': 16}  # a quarter of block_size
    assert variants['layers=LLLG'] == {**modern, 'layers': 'LLLG', **window}
    assert variants['layers=L'] == {**modern, 'layers': 'L', **window}
    assert variants['layers=LG+sinks'] == {**modern, 'layers': 'LG', **window, 'attn_sinks': True}
    assert variants['modern+gate'] == {**modern, 'attn_gate': True}
    assert variants['layers=GGGN'] == {**modern, 'layers': 'GGGN'}
    assert variants['rope_fraction=0.25'] == {**modern, 'rope_fraction': 0.25}
    assert variants['modern+sandwich'] == {**modern, 'norm_position': 'sandwich'}
    assert variants['modern+after'] == {**modern, 'norm_position': 'after'}
    from chapters import GPTConfig
    for flags in variants.values():  # every variant is a model the recipe can build (Muon is train.py's)
        GPTConfig(**{**model_args(base), **{k: v for k, v in flags.items() if k != 'optimizer'}})


def test_the_hybrid_group_varies_the_layer_kinds_at_about_equal_parameters(monkeypatch):
    """Each constant-memory kind 3:1 with global attention and alone: Gated DeltaNet differs from modern only in
    its layers and widths, Kimi Delta Attention, Mamba-2 and the short convolution in their layers and MLP width,
    and the parameters of all stay within 1% of modern's."""
    _, base, variants = ablate_grid(monkeypatch, '--grid=hybrid')
    assert list(variants) == ['modern', 'layers=DDDG', 'layers=D', 'layers=KKKG', 'layers=K', 'layers=SSSG',
                              'layers=S', 'layers=VVVG', 'layers=V']
    modern = variants['modern']
    for kind in 'KSV':
        for pattern in (kind * 3 + 'G', kind):
            flags = variants[f'layers={pattern}']
            assert flags == {**modern, 'layers': pattern, 'ffn_hidden': flags['ffn_hidden']}
    linear = {k: v for k, v in variants['layers=D'].items() if k.startswith('linear_')}
    assert variants['layers=DDDG'] == {**modern, 'layers': 'DDDG', **linear}
    assert variants['layers=D'] == {**modern, 'layers': 'D', **linear}
    from chapters import GPT, GPTConfig
    sizes = [GPT(GPTConfig(**{**model_args(base), 'vocab_size': 65, **flags})).get_num_params()
             for flags in variants.values()]
    assert max(sizes) < 1.01 * sizes[0] and min(sizes) > 0.99 * sizes[0], sizes


def test_the_chunked_group_sets_chunks_against_windows_of_the_same_size(monkeypatch):
    _, base, variants = ablate_grid(monkeypatch, '--grid=chunked')  # the CPU recipe: block_size 64
    modern = variants['modern']
    assert list(variants) == ['modern', 'layers=GGGN', 'layers=CCCN+attention_chunk_size=16',
                              'layers=LLLN+sliding_window=16', 'layers=CCCN+attention_chunk_size=32',
                              'layers=LLLN+sliding_window=32']
    assert variants['layers=CCCN+attention_chunk_size=16'] == {**modern, 'layers': 'CCCN', 'attention_chunk_size': 16}
    assert variants['layers=LLLN+sliding_window=32'] == {**modern, 'layers': 'LLLN', 'sliding_window': 32}
    from chapters import GPT, GPTConfig
    sizes = {GPT(GPTConfig(**{**model_args(base), 'vocab_size': 65, **flags})).get_num_params()
             for flags in variants.values()}
    assert len(sizes) == 1  # chunks and windows change no weight


def test_the_sparse_and_mtp_groups_vary_only_their_flags(monkeypatch):
    """sparse: modern, and DSA at k of a quarter and an eighth of block_size, with and without the KL loss; mtp:
    modern and depths 1 and 2; every variant a model the recipe builds."""
    ablate_module, base, variants = ablate_grid(monkeypatch, '--grid=sparse,mtp')
    modern, quarter, eighth = variants['modern'], base['block_size'] // 4, base['block_size'] // 8
    assert list(variants) == ['modern', f'dsa_topk={quarter}', f'dsa_topk={quarter}_no_kl', f'dsa_topk={eighth}',
                              f'dsa_topk={eighth}_no_kl', 'mtp_depth=1', 'mtp_depth=2']
    sparse = variants[f'dsa_topk={eighth}']
    assert sparse == {**modern, 'index_topk': eighth, 'index_loss_coef': 1.0, 'index_head_dim': sparse['index_head_dim']}
    assert variants[f'dsa_topk={eighth}_no_kl'] == {**sparse, 'index_loss_coef': 0.0}
    assert variants['mtp_depth=2'] == {**modern, 'mtp_depth': 2}
    from chapters import GPTConfig
    for flags in variants.values():
        GPTConfig(**{**model_args(base), **flags})


def test_the_kv_sharing_group_shares_a_quarter_and_a_half_of_the_layers_and_sets_k_eq_v(monkeypatch):
    _, base, variants = ablate_grid(monkeypatch, '--grid=kv_sharing')  # the CPU recipe: 4 layers
    modern = variants['modern']
    assert list(variants) == ['modern', 'kv_shared_layers=1', 'kv_shared_layers=2', 'modern+attn_k_eq_v']
    assert variants['kv_shared_layers=2'] == {**modern, 'kv_shared_layers': 2}
    from chapters import GPT, GPTConfig
    cache = [GPT(GPTConfig(**{**model_args(base), 'vocab_size': 65, **flags})).kv_cache_bytes(1, 64)
             for flags in variants.values()]
    assert cache == [cache[0], cache[0] * 3 // 4, cache[0] // 2, cache[0]]  # K = V keeps both in the cache


def test_the_per_layer_embeddings_group_matches_the_dense_block_in_parameters_and_in_flops(monkeypatch):
    """Gemma 4's per-layer embeddings against the modern block widened (ffn_hidden) to the same total parameters
    and to the same FLOPs per token: each control nearer its target than one MLP unit more or less would be."""
    # the CPU recipe: 4 layers, 128 wide
    ablate_module, base, variants = ablate_grid(monkeypatch, '--grid=per_layer_embeddings')
    names = list(variants)
    assert names[:2] == ['modern', 'per_layer_embd=32'] and len(names) == 4
    assert variants['per_layer_embd=32'] == {**variants['modern'], 'per_layer_embd': 32}
    from chapters import GPT, GPTConfig
    args = {**model_args(base), 'vocab_size': base_vocab(base, ablate_module.settings)}
    build = lambda flags: GPT(GPTConfig(**{**args, **flags}))
    ple = build(variants['per_layer_embd=32'])
    for name, measure in ((names[2], lambda m: m.get_num_params()), (names[3], lambda m: m.flops_per_token())):
        flags = variants[name]
        assert name.endswith(f"_ffn={flags['ffn_hidden']}") and 'per_layer_embd' not in flags
        gaps = [abs(measure(build({**flags, 'ffn_hidden': flags['ffn_hidden'] + d})) - measure(ple)) for d in (-1, 0, 1)]
        assert gaps[1] <= min(gaps[0], gaps[2])
    assert build(variants[names[2]]).get_num_params() > build(variants['modern']).get_num_params()


def test_the_evidence_groups(tmp_path, monkeypatch, capsys):
    """recall: 5 architectures x widths x lengths, each length its own dataset (a missing one is one line naming
    its prepare command); length_generalization on data/copy; sinks with the gate and learned sinks."""
    workdir = make_workdir(tmp_path)
    code, err = ablate_here(workdir, tmp_path / 'out', '--grid=recall', monkeypatch=monkeypatch, capsys=capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and 'python data/recall/prepare.py --seq_len 32 --num_pairs 4' in lines[0]
    for length in (32, 64):
        (workdir / 'data' / f'recall_{length}').mkdir(parents=True)
        (workdir / 'data' / f'recall_{length}' / 'meta.json').write_text(json.dumps({'example_length': length}))
    (workdir / 'data' / 'copy').mkdir()
    (workdir / 'data' / 'copy' / 'meta.json').write_text(json.dumps({'splits': {
        'train': {'example_length': 33}, 'val': {'example_length': 33}, 'val_4x': {'example_length': 129}}}))
    _, base, variants = ablate_grid(monkeypatch, f'--run_dir={workdir}', '--grid=recall,length_generalization,sinks',
                                    '--recall_widths=32,64', '--recall_lengths=32,64')
    recall = [n for n in variants if n.endswith(('L=32', 'L=64'))]
    assert len(recall) == 5 * 2 * 2
    wide = variants['global_d=64_L=32']
    assert {k: wide[k] for k in ('dataset', 'block_size', 'n_embd', 'n_head', 'pos')} == {
        'dataset': 'recall_32', 'block_size': 31, 'n_embd': 64, 'n_head': 2, 'pos': 'rope'}
    assert variants['L_d=32_L=64'] == {**variants['global_d=32_L=64'], 'layers': 'L', 'sliding_window': 16}
    assert variants['DDDG_d=64_L=64']['layers'] == 'DDDG' and variants['mla_d=64_L=64']['attn'] == 'mla'
    assert variants['learned']['pos'] == 'learned' and variants['learned']['block_size'] == 128
    assert variants['rope']['block_size'] == 32 and variants['nope']['layers'] == 'N'
    assert all(variants[n]['dataset'] == 'copy' for n in ('learned', 'rope', 'nope', 'layers=GGGN'))
    assert variants['modern+gate+sinks'] == {**variants['modern'], 'attn_gate': True, 'attn_sinks': True}
    from chapters import GPTConfig
    for flags in variants.values():  # every variant is a model the recipe can build
        GPTConfig(**{**model_args(base), **{k: v for k, v in flags.items() if k != 'dataset'}})


def test_the_block_sparse_group_reads_the_same_keys_as_tokens_and_as_blocks_by_each_scoring(monkeypatch):
    """block_sparse: dense, DSA and block selection all reading a quarter of block_size (blocks: four of them), the
    blocks scored as MiniMax-M3 (max, the own block kept), QSA (mean) and KPool (learned), the pooled ones reading
    the unfinished block always as both families do; every variant a model the recipe builds and trains."""
    _, base, variants = ablate_grid(monkeypatch, '--grid=block_sparse')
    topk = base['block_size'] // 4
    block = topk // 4
    assert list(variants) == ['modern', f'dsa_topk={topk}'] + [f'blocks={block}_{p}' for p in ('max', 'mean', 'learned')]
    dsa = variants[f'dsa_topk={topk}']
    assert dsa == {**variants['modern'], 'index_topk': topk, 'index_loss_coef': 1.0, 'index_head_dim': dsa['index_head_dim']}
    assert variants[f'blocks={block}_max'] == {**dsa, 'index_block_size': block, 'index_block_pool': 'max'}
    for pool in ('mean', 'learned'):
        assert variants[f'blocks={block}_{pool}'] == {**dsa, 'index_block_size': block, 'index_block_pool': pool,
                                                      'index_tail': 'keep', 'index_local_blocks': 0}
    from chapters import GPT, GPTConfig
    torch.manual_seed(0)
    idx = torch.randint(0, 65, (2, base['block_size']))
    for name, flags in variants.items():
        model = GPT(GPTConfig(**{**model_args(base), 'vocab_size': 65, **flags}))
        loss = model(idx, idx)[1]
        assert torch.isfinite(loss), name


def test_the_recall_group_takes_any_layer_pattern_at_about_equal_parameters(tmp_path, monkeypatch, capsys):
    """recall_archs: Kimi Delta Attention, Mamba-2, the short convolution (issue 31's recall question) beside global
    attention, each width's models within 1% of its global one; a pattern of unknown letters is one line."""
    workdir = make_workdir(tmp_path)
    (workdir / 'data' / 'recall_32').mkdir(parents=True)
    (workdir / 'data' / 'recall_32' / 'meta.json').write_text(json.dumps({'example_length': 32, 'vocab_size': 64}))
    code, err = ablate_here(workdir, tmp_path / 'out', '--grid=recall', '--recall_lengths=32', '--recall_archs=global,XG',
                            monkeypatch=monkeypatch, capsys=capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "recall_archs must be" in err and "'global,XG'" in err
    _, base, variants = ablate_grid(monkeypatch, f'--run_dir={workdir}', '--grid=recall', '--recall_widths=32,64',
                                    '--recall_lengths=32', '--recall_archs=global,KKKG,S,VVVG')
    assert list(variants) == [f'{a}_d={w}_L=32' for w in (32, 64) for a in ('global', 'KKKG', 'S', 'VVVG')]
    from chapters import GPT, GPTConfig
    for width in (32, 64):
        sizes = [GPT(GPTConfig(**{**model_args(base), 'vocab_size': 64,
                                  **{k: v for k, v in variants[f'{a}_d={width}_L=32'].items() if k != 'dataset'}}))
                 .get_num_params() for a in ('global', 'KKKG', 'S', 'VVVG')]
        assert max(sizes) < 1.01 * sizes[0] and min(sizes) > 0.99 * sizes[0], sizes
    assert variants['S_d=64_L=32']['layers'] == 'S' and variants['S_d=64_L=32']['n_embd'] == 64
    # the indexers by name: a quarter of the 32 tokens, as single tokens or as four blocks of two
    _, _, variants = ablate_grid(monkeypatch, f'--run_dir={workdir}', '--grid=recall', '--recall_widths=64',
                                 '--recall_lengths=32', '--recall_archs=global,dsa,blocks')
    dsa, blocks = variants['dsa_d=64_L=32'], variants['blocks_d=64_L=32']
    assert dsa['index_topk'] == 8 and 'index_block_size' not in dsa
    assert blocks == {**dsa, 'index_block_size': 2, 'index_block_pool': 'max'}


def test_the_recall_group_takes_pair_counts_each_its_own_dataset(tmp_path, monkeypatch, capsys):
    """recall_pairs: the same length at several pair counts (the state's load), L / 8 keeping its old names and
    data/recall_<L>, any other count data/recall_<L>_p<P>; a missing dataset or a count that does not fit is one
    line."""
    workdir = make_workdir(tmp_path)
    (workdir / 'data' / 'recall_32').mkdir(parents=True)
    (workdir / 'data' / 'recall_32' / 'meta.json').write_text(json.dumps(
        {'example_length': 32, 'settings': {'num_pairs': 4}}))
    args = ('--grid=recall', '--recall_lengths=32', '--recall_widths=64', '--recall_archs=global,D')
    code, err = ablate_here(workdir, tmp_path / 'out', *args, '--recall_pairs=4,8', monkeypatch=monkeypatch,
                            capsys=capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].endswith(
        'python data/recall/prepare.py --seq_len 32 --num_pairs 8 --vocab_size 64 --out_dir data/recall_32_p8')
    code, err = ablate_here(workdir, tmp_path / 'out', *args, '--recall_pairs=9', monkeypatch=monkeypatch,
                            capsys=capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and '9 pairs' in lines[0] and '1 to 8 pairs' in lines[0]
    (workdir / 'data' / 'recall_32_p8').mkdir()
    (workdir / 'data' / 'recall_32_p8' / 'meta.json').write_text(json.dumps(
        {'example_length': 32, 'settings': {'num_pairs': 2}}))  # not the count its name says
    code, err = ablate_here(workdir, tmp_path / 'out', *args, '--recall_pairs=8', monkeypatch=monkeypatch,
                            capsys=capsys)
    assert code == 2 and 'data/recall_32_p8 (examples of 32 tokens, 8 pairs)' in err
    (workdir / 'data' / 'recall_32_p8' / 'meta.json').write_text(json.dumps(
        {'example_length': 32, 'settings': {'num_pairs': 8}}))
    _, _, variants = ablate_grid(monkeypatch, f'--run_dir={workdir}', *args, '--recall_pairs=4,8')
    assert list(variants) == ['global_d=64_L=32', 'D_d=64_L=32', 'global_d=64_L=32_P=8', 'D_d=64_L=32_P=8']
    assert variants['D_d=64_L=32_P=8'] == {**variants['D_d=64_L=32'], 'dataset': 'recall_32_p8'}
    assert recall_points(variants) == {
        'global_d=64_L=32': ('global', (32, 4), 64, None), 'D_d=64_L=32': ('D', (32, 4), 64, None),
        'global_d=64_L=32_P=8': ('global', (32, 8), 64, None), 'D_d=64_L=32_P=8': ('D', (32, 8), 64, None)}


def test_the_recall_group_sweeps_depths_and_learning_rates_as_zoology_does(tmp_path, monkeypatch, capsys):
    """recall_depths sets n_layer, a pattern longer than the depth keeping each kind once ('DDDG' at 2 layers is
    'DG'); recall_lrs sets the peak rate and its floor at the recipe's ratio; a depth that cannot hold a pattern's
    kinds is one line, and so is a depth of 0."""
    workdir = make_workdir(tmp_path)
    (workdir / 'data' / 'recall_32').mkdir(parents=True)
    (workdir / 'data' / 'recall_32' / 'meta.json').write_text(json.dumps(
        {'example_length': 32, 'settings': {'num_pairs': 4}}))
    args = (f'--run_dir={workdir}', '--grid=recall', '--recall_lengths=32', '--recall_widths=64',
            '--recall_archs=global,DDDG', '--recall_depths=2,4', '--recall_lrs=1e-3,3e-3')
    _, base, variants = ablate_grid(monkeypatch, *args)
    assert list(variants) == [f'{a}_d=64_L=32_n={n}_lr={r}' for n in (2, 4) for a in ('global', 'DDDG')
                              for r in ('0.001', '0.003')]
    hybrid_2, hybrid_4 = variants['DDDG_d=64_L=32_n=2_lr=0.003'], variants['DDDG_d=64_L=32_n=4_lr=0.001']
    assert hybrid_2['layers'] == 'DG' and hybrid_2['n_layer'] == 2 and hybrid_4['layers'] == 'DDDG'
    ratio = base['min_lr'] / base['learning_rate']
    assert hybrid_2['learning_rate'] == 0.003 and hybrid_2['min_lr'] == pytest.approx(0.003 * ratio)
    assert variants['global_d=64_L=32_n=4_lr=0.001']['n_layer'] == 4
    assert recall_points(variants)['DDDG_d=64_L=32_n=2_lr=0.003'] == ('DDDG n=2', (32, 4), 64, 0.003)
    code, err = ablate_here(workdir, tmp_path / 'out', *args[1:4], '--recall_archs=DLG', '--recall_depths=2',
                            monkeypatch=monkeypatch, capsys=capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "2 layers cannot hold the 3 kinds of" in err
    for depths in ('0', '2,0'):  # 0 once read as 'not set' and ran the recipe's 4 layers
        code, err = ablate_here(workdir, tmp_path / 'out', *args[1:4], f'--recall_depths={depths}',
                                monkeypatch=monkeypatch, capsys=capsys)
        lines = err.strip().splitlines()
        assert code == 2 and lines == [f"error: recall_depths must be comma-separated positive integers, e.g. "
                                       f"--recall_depths=1,2,4; got '{depths}'"], err
    for rates in ('1e-3,inf', 'nan', '1e999'):  # inf passed the check once, and every run at that rate failed
        code, err = ablate_here(workdir, tmp_path / 'out', *args[1:4], f'--recall_lrs={rates}',
                                monkeypatch=monkeypatch, capsys=capsys)
        lines = err.strip().splitlines()
        assert code == 2 and lines == [f"error: recall_lrs must be comma-separated positive numbers, e.g. "
                                       f"--recall_lrs=1e-3,1e-2; got '{rates}'"], err


def test_what_a_recall_run_would_fail_on_is_refused_at_the_start(tmp_path, monkeypatch, capsys):
    """recall_archs=C gets its chunk from the layer-kind registry (LayerKind.needs), as 'L' its window; widths that do
    not split into heads 32 wide (0, 100) and a variant whose model cannot be built are one line before any run
    starts, not a failure per run after launch (issue 44.13)."""
    workdir = make_workdir(tmp_path)
    (workdir / 'data' / 'recall_32').mkdir(parents=True)
    (workdir / 'data' / 'recall_32' / 'meta.json').write_text(json.dumps({'example_length': 32, 'vocab_size': 64}))
    _, base, variants = ablate_grid(monkeypatch, f'--run_dir={workdir}', '--grid=recall', '--recall_widths=64',
                                    '--recall_lengths=32', '--recall_archs=C,CCCG,L')
    chunked = variants['C_d=64_L=32']
    assert chunked['layers'] == 'C' and chunked['attention_chunk_size'] == 8 and 'sliding_window' not in chunked
    assert variants['CCCG_d=64_L=32']['attention_chunk_size'] == 8 and variants['L_d=64_L=32']['sliding_window'] == 8
    # DeepSeek-V4's compressed layers: what they need besides a size keeps its value (each need once read as the
    # window's size: attn=8, n_kv_head=8), and HCA pools a window's worth of tokens, not V4's 128 past block_size
    _, _, variants = ablate_grid(monkeypatch, f'--run_dir={workdir}', '--grid=recall', '--recall_widths=64',
                                 '--recall_lengths=32', '--recall_archs=HG,IG')
    hca, csa = variants['HG_d=64_L=32'], variants['IG_d=64_L=32']
    assert hca['layers'] == 'HG' and hca['attn'] == 'shared_kv' and hca['n_kv_head'] is None and hca['hca_rate'] == 8
    assert csa['layers'] == 'IG' and csa['attn'] == 'shared_kv' and csa['n_kv_head'] is None
    assert csa['csa_index_dim'] == 32 and 'hca_rate' not in csa
    for widths, says in (('0', ' must be comma-separated positive integers'), ('100', ': n_embd 100'),
                         ('32,100', ': n_embd 100')):
        code, err = ablate_here(workdir, tmp_path / 'out', '--grid=recall', '--recall_lengths=32',
                                f'--recall_widths={widths}', monkeypatch=monkeypatch, capsys=capsys)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith(f'error: recall_widths{says}'), err
    code, err = ablate_here(workdir, tmp_path / 'out', '--grid=custom', "--custom={'ok': {}, 'bad': {'n_kv_head': 3}}",
                            monkeypatch=monkeypatch, capsys=capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: variant 'bad': ") and 'n_kv_head' in lines[0]
    assert not (tmp_path / 'out').exists()


def test_the_hyper_connections_group_sets_four_copies_against_one_widened_to_their_cost(monkeypatch):
    """modern + Muon with one copy, mHC and independent HC with four, and one copy whose MLP is widened to the mHC
    model's parameters and to its FLOPs: each control nearer its target than one MLP unit more or less."""
    ablate_module, base, variants = ablate_grid(monkeypatch, '--grid=hyper_connections')
    names = list(variants)
    # the two controls are one run when one width is nearest both the parameters and the FLOPs
    assert names[:3] == ['modern+muon', 'mhc_n=4', 'ihc_n=4'] and len(names) in (4, 5)
    one = variants['modern+muon']
    assert one['optimizer'] == 'muon' and 'hc_mult' not in one
    assert variants['mhc_n=4'] == {**one, 'hc_mult': 4}
    assert variants['ihc_n=4'] == {**one, 'hc_mult': 4, 'hc_kind': 'ihc'}
    from chapters import GPT, GPTConfig
    args = {**model_args(base), 'vocab_size': base_vocab(base, ablate_module.settings)}
    build = lambda flags: GPT(GPTConfig(**{**args, **{k: v for k, v in flags.items() if k != 'optimizer'}}))
    mhc = build(variants['mhc_n=4'])
    controls = names[3:]
    for kind, measure in (('equal_params', lambda m: m.get_num_params()), ('equal_flops', lambda m: m.flops_per_token())):
        name = next((n for n in controls if n.startswith(kind)), controls[0])
        flags = variants[name]
        assert name.endswith(f"_ffn={flags['ffn_hidden']}") and 'hc_mult' not in flags and flags['optimizer'] == 'muon'
        gaps = [abs(measure(build({**flags, 'ffn_hidden': flags['ffn_hidden'] + d})) - measure(mhc)) for d in (-1, 0, 1)]
        assert gaps[1] <= min(gaps[0], gaps[2])


def test_the_speedrun_group_adds_each_switch_alone_then_all(monkeypatch):
    _, base, variants = ablate_grid(monkeypatch, '--grid=speedrun')  # the CPU recipe: 4 layers
    muon = variants['modern+muon']
    names = list(variants)
    assert names[0] == 'modern+muon' and names[-1] == '+all' and len(names) == 13
    assert variants['+smear'] == {**muon, 'smear': True}
    assert variants['+backout'] == {**muon, 'backout_layer': 2}
    assert variants['+xsa'] == {**muon, 'xsa_layers': '0,1,2,3'}
    for name in names[1:-1]:  # each switch alone: one or two flags more than the base, all of them in '+all'
        extra = {k: v for k, v in variants[name].items() if muon.get(k) != v}
        assert extra and all(variants['+all'][k] == v for k, v in extra.items()), name
    from chapters import GPTConfig
    for flags in variants.values():  # every variant is a model the recipe can build (Muon is train.py's)
        GPTConfig(**{**model_args(base), **{k: v for k, v in flags.items() if k != 'optimizer'}})
    assert variants['+value_embeds']['value_embed_layers'] == '0,-1'
    _, base, variants = ablate_grid(monkeypatch, '--grid=speedrun', '--train_args=--n_layer=1',  # a miniseries' depth 1
                                   '--members=modern+muon,+value_embeds,+bigram')  # U-net skips need 3 layers
    assert variants['+value_embeds']['value_embed_layers'] == '0'  # the first layer is the last
    for flags in variants.values():
        GPTConfig(**{**model_args(base), **{k: v for k, v in flags.items() if k != 'optimizer'}})


def test_the_compressed_and_router_groups(tmp_path, monkeypatch, capsys):
    """compressed: V4's attention (a quarter-sequence window on every layer, HCA pooling a window per entry, CSA
    every 4 with a quarter of its entries read) and its windows alone beside GQA and MLA; router: the three scores
    on the same experts, then hash routing on the first layer; each variant a model the recipe builds and trains.
    recall_archs takes 'v4', sized by the recall length."""
    _, base, variants = ablate_grid(monkeypatch, '--grid=compressed,router')
    T, modern = base['block_size'], variants['modern']
    v4 = {**modern, 'n_kv_head': None, 'attn': 'shared_kv', 'attn_sinks': True, 'sliding_window': T // 4}
    assert variants['v4'] == {**v4, 'layers': 'LHLI', 'hca_rate': T // 4, 'csa_rate': 4, 'csa_topk': T // 16}
    assert variants['v4-window'] == {**v4, 'layers': 'L'} and variants['mla']['attn'] == 'mla'
    routed = {**modern, 'mlp': 'moe', 'n_expert': 8, 'n_expert_active': 2}
    assert variants['softmax'] == {**routed, 'moe_aux_loss_coef': 0.01}
    assert variants['sigmoid'] == {**routed, 'router': 'sigmoid'}
    assert variants['sqrtsoftplus'] == {**routed, 'router': 'sigmoid', 'router_score': 'sqrtsoftplus'}
    assert variants['sqrtsoftplus+hash'] == {**variants['sqrtsoftplus'], 'hash_moe_layers': 1}
    from chapters import GPT, GPTConfig
    torch.manual_seed(0)
    idx = torch.randint(0, 65, (2, T))
    for name, flags in variants.items():
        model = GPT(GPTConfig(**{**model_args(base), 'vocab_size': 65, **flags}))
        loss = model(idx, idx)[1]
        loss.backward()
        assert torch.isfinite(loss), name
    workdir = make_workdir(tmp_path)
    (workdir / 'data' / 'recall_32').mkdir(parents=True)
    (workdir / 'data' / 'recall_32' / 'meta.json').write_text(json.dumps({'example_length': 32, 'vocab_size': 64}))
    _, _, variants = ablate_grid(monkeypatch, f'--run_dir={workdir}', '--grid=recall', '--recall_widths=64',
                                 '--recall_lengths=32', '--recall_archs=v4')
    assert variants['v4_d=64_L=32']['sliding_window'] == 8 and variants['v4_d=64_L=32']['csa_topk'] == 2
