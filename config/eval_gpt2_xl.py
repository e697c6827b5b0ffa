# evaluate the pretrained gpt2-xl on OpenWebText: python train.py config/eval_gpt2_xl.py
exec(open('config/eval_gpt2.py').read())
init_from = 'gpt2-xl'
