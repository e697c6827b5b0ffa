# The four swaps as a miniseries on GPT-2's BPE of Shakespeare, on a CPU, sized as the character one (depths 1-4,
# n_embd 32 x depth, heads 16 wide, 3 seeds). GPT-2's 50,304-token head costs 6 x 50,304 x n_embd FLOPs a token,
# several times the blocks' at these widths, so a BPE token costs more than a character; and the text is 302k
# training tokens: at 2 tokens a parameter the 4-layer model reads it 5 times over (the val loss is the final one,
# not the best: where it overfits, the fit shows it).
#   python data/shakespeare/prepare.py     # once (offline: --input path/to/input.txt)
#   python ablate.py config/ablate_miniseries_bpe_cpu.py
exec(open('config/ablate_miniseries_char_cpu.py').read())
out_dir = 'out-miniseries-bpe'
train_config = 'config/shakespeare_bpe_vanilla_cpu.py'
tokens_per_param = 2.0
