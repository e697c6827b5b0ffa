"""common/records.py, through train.py: what an evaluation logs (wandb's flat keys)."""

from test_train import train, workdir  # noqa: F401 (fixtures)


def test_wandb_offline_writes_its_run(workdir):
    """With MoE layers, wandb gets the log.jsonl record's nested expert load as flat keys."""
    train(workdir, '--max_iters=2', '--eval_interval=2', '--out_dir=out', '--wandb_log=True',
          '--wandb_run_name=tiny', '--mlp=moe', '--n_expert=4')
    runs = list((workdir / 'out' / 'wandb').glob('offline-run-*'))
    assert len(runs) == 1
    logged = next(runs[0].rglob('*.wandb')).read_bytes()  # the run's records, as wandb sync will send them
    for key in (b'val_loss', b'moe/load/0/3', b'moe/max_over_mean/1', b'moe/aux_loss'):
        assert key in logged, key


def test_a_task_evaluation_reads_as_one_line_and_nested_records_flatten():
    from common.records import accuracy_fields, accuracy_text, flat_record
    losses = {'train': 1.0, 'val': 1.5, 'val_2x': 2.0, 'val_4x': None,
              'accuracy': {'train': 0.9, 'val': 0.872, 'val_2x': 0.3141, 'val_4x': None}}
    splits = ['val', 'val_2x', 'val_4x']
    assert accuracy_text(losses, splits) == ', accuracy 0.872 (val_2x 0.314, val_4x n/a)'
    assert accuracy_fields(losses, splits) == {
        'accuracy': 0.872, 'train_accuracy': 0.9,
        'lengths': {'val_2x': {'loss': 2.0, 'accuracy': 0.3141}, 'val_4x': {'loss': None, 'accuracy': None}}}
    assert accuracy_text({'train': 1.0, 'val': 1.5}, ['val']) == '' and accuracy_fields({'val': 1.5}, ['val']) == {}
    assert flat_record({'iter': 2, 'moe': {'load': [[0.5, 0.5]], 'aux_loss': 1.0}}) == {
        'iter': 2, 'moe/load/0/0': 0.5, 'moe/load/0/1': 0.5, 'moe/aux_loss': 1.0}
