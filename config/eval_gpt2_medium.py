# evaluate the pretrained gpt2-medium on OpenWebText: python train.py config/eval_gpt2_medium.py
exec(open('config/eval_gpt2.py').read())
init_from = 'gpt2-medium'
