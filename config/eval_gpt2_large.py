# evaluate the pretrained gpt2-large on OpenWebText: python train.py config/eval_gpt2_large.py
exec(open('config/eval_gpt2.py').read())
init_from = 'gpt2-large'
