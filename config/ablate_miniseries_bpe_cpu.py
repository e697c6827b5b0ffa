# The four swaps as a miniseries on GPT-2's BPE of Shakespeare, on a CPU, sized as the character one (depths 1-4,
# n_embd 32 x depth, heads 16 wide, 3 seeds). The text's tokens are GPT-2's, renumbered to the 11,706 ids it uses
# (data/shakespeare_compact): the head costs 6 x vocab x n_embd FLOPs a token, and GPT-2's full 50,304 would make
# it 4.3x as much, nearly all of these small models' compute. The text is 302k training tokens: at 2 tokens a
# parameter the 3-layer model reads it 2.2 times and the 4-layer one 5 times (the val loss is the final one, not the
# best: where it overfits, the fit shows it).
#   python data/shakespeare_compact/prepare.py     # once (offline: --input path/to/input.txt)
#   python ablate.py config/ablate_miniseries_bpe_cpu.py
exec(open('config/ablate_miniseries_char_cpu.py').read())
out_dir = 'out-miniseries-bpe'
train_config = 'config/shakespeare_bpe_vanilla_cpu.py'
train_args = '--multiple_of=16 --dataset=shakespeare_compact'
tokens_per_param = 2.0
