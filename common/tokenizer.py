"""Tokenizers: a dataset's own vocabulary (characters, recall's names), tiktoken's BPE or a Hugging Face tokenizer, for
our scripts; and a run's tokenizer as transformers loads it, for export."""

import json
import os
from collections import namedtuple

from common.errors import die, first_line


# source: what the text is encoded with, named in errors ("GPT-2's BPE (tried because 'DIR' holds no tokenizer)");
# guessed: GPT-2's BPE for a model that brings no tokenizer (worth a note)
Tokenizer = namedtuple('Tokenizer', 'encode decode vocab_size source guessed', defaults=(False,))
# the files a Hugging Face tokenizer is saved as: a model directory holding none of them has no tokenizer
TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json', 'vocab.json', 'tokenizer.model')


def load_tokenizer(meta_path=None, pretrained=None, name=''):
    """A Tokenizer from a dataset's meta.json (character level or tiktoken), a pretrained model's own
    Hugging Face tokenizer, or else GPT-2's BPE; name (a user's choice) overrides them all: 'gpt2' is tiktoken's
    BPE, anything else a Hugging Face tokenizer name or directory. vocab_size: ids 0..vocab_size-1 decode to
    text."""
    if name:
        return _tiktoken('gpt2', "GPT-2's BPE") if name == 'gpt2' else _hf_tokenizer(name, f"the tokenizer '{name}'")
    meta = {'kind': 'tiktoken', 'encoding': 'gpt2'}
    if meta_path is not None:
        try:
            with open(meta_path) as f:
                meta = json.load(f)
        except (OSError, ValueError) as e:
            die(f"cannot read '{meta_path}': {e}")
        if not isinstance(meta, dict):
            die(f"'{meta_path}' is not a dataset's meta.json (not a JSON object); rerun the dataset's prepare.py")
    if meta.get('kind') == 'char':
        chars = meta.get('chars')
        if not isinstance(chars, list) or not chars or not all(isinstance(c, str) for c in chars):
            die(f"'{meta_path}' is a character vocabulary (kind 'char') without its 'chars' list of characters; "
                f"rerun the dataset's prepare.py")
        stoi = {c: i for i, c in enumerate(chars)}

        def encode(text):
            unknown = sorted(set(text) - stoi.keys())
            if unknown:
                die(f"characters not in the vocabulary of '{meta_path}': "
                    f"{' '.join(repr(c) for c in unknown)}")
            return [stoi[c] for c in text]
        return Tokenizer(encode, lambda ids: ''.join(chars[i] for i in ids), len(chars), f"'{meta_path}'")
    if meta.get('kind') == 'recall':
        return _recall_tokenizer(meta, meta_path)
    if meta.get('kind', 'tiktoken') != 'tiktoken':  # a task's own ids are no BPE text: never decode them as one
        die(f"'{meta_path}' has a vocabulary of kind {meta['kind']!r}, which no tokenizer here reads (kinds: 'char', "
            f"'tiktoken', 'recall')")
    if pretrained is not None and not pretrained.startswith('gpt2'):
        # a Llama checkpoint brings its own tokenizer (an export.py directory too); a bare GPT-2 one may not, and
        # transformers then makes an empty one that encodes any text to nothing
        missing = None
        if os.path.isdir(pretrained) and not any(os.path.exists(os.path.join(pretrained, f)) for f in TOKENIZER_FILES):
            missing = f"'{pretrained}' holds no tokenizer"
        else:
            try:
                return _hf_tokenizer(pretrained, f"the tokenizer of '{pretrained}'", required=False)
            except LookupError:
                missing = f"no tokenizer was found with '{pretrained}'"
        return _tiktoken('gpt2', f"GPT-2's BPE (tried because {missing})")._replace(guessed=True)
    bpe = _tiktoken(meta.get('encoding', 'gpt2'), f"tiktoken's {meta.get('encoding', 'gpt2')!r}")
    return _renumbered(bpe, meta['ids'], meta_path) if 'ids' in meta else bpe


def _renumbered(bpe, ids, meta_path):
    """bpe over the ids a dataset renumbered (meta.json's 'ids': the BPE id of each of its ids, as
    data/shakespeare_compact writes them); a prompt with a BPE token outside them is an error line."""
    if not renumbering_ok(ids, bpe.vocab_size):
        die(f"'{meta_path}' has 'ids' that are not distinct token ids of {bpe.source} (0..{bpe.vocab_size - 1}); "
            f"rerun the dataset's prepare.py")
    new = {old: i for i, old in enumerate(ids)}

    def encode(text):
        tokens = bpe.encode(text)
        missing = sorted({bpe.decode([t]) for t in tokens if t not in new})
        if missing:
            die(f"tokens not in the vocabulary of '{meta_path}' (the {len(ids)} its text uses): "
                f"{' '.join(repr(m) for m in missing[:10])}")
        return [new[t] for t in tokens]
    return Tokenizer(encode, lambda tokens: bpe.decode([ids[i] for i in tokens]), len(ids), f"{bpe.source} as "
                     f"'{meta_path}' renumbers it")


def renumbering_ok(ids, n_vocab):
    """Whether meta.json's 'ids' is a list of distinct token ids below n_vocab (a renumbered vocabulary's)."""
    return isinstance(ids, list) and all(isinstance(i, int) and 0 <= i < n_vocab for i in ids) and \
        len(set(ids)) == len(ids)


def _recall_tokenizer(meta, meta_path):
    """data/recall's ids as names, each followed by a space: '.' the filler, k<i> the i-th key, v<i> the i-th
    value."""
    vocabulary = meta.get('vocabulary') or {}
    try:
        (k_lo, k_hi), (v_lo, v_hi) = vocabulary['keys'], vocabulary['values']
        names = {vocabulary['filler']: '.'}
    except (KeyError, TypeError, ValueError):
        die(f"'{meta_path}' is a recall vocabulary without its 'vocabulary' (filler, keys, values); rerun "
            f"python data/recall/prepare.py")
    names.update({i: f'k{i - k_lo}' for i in range(k_lo, k_hi)})
    names.update({i: f'v{i - v_lo}' for i in range(v_lo, v_hi)})
    ids = {name: i for i, name in names.items()}

    def encode(text):
        unknown = [word for word in text.split() if word not in ids]
        if unknown:
            die(f"not names of the recall vocabulary of '{meta_path}' ('.', k0..k{k_hi - k_lo - 1}, "
                f"v0..v{v_hi - v_lo - 1}): {' '.join(unknown[:5])}")
        return [ids[word] for word in text.split()]
    # each name ends in its space: pieces decoded one after another (sample.py streams) read as the whole
    return Tokenizer(encode, lambda tokens: ''.join(names.get(i, f'<{i}>') + ' ' for i in tokens), meta['vocab_size'],
                     f"'{meta_path}'")


def _tiktoken(encoding, source):
    import tiktoken
    try:
        enc = tiktoken.get_encoding(encoding)
    except Exception as e:
        die(f"cannot load tiktoken encoding {encoding!r} ({type(e).__name__}); "
            f"offline, point TIKTOKEN_CACHE_DIR at a cache holding it")
    return Tokenizer(lambda text: enc.encode(text, allowed_special={'<|endoftext|>'}), enc.decode, enc.n_vocab, source)


def _hf_tokenizer(name, source, required=True):
    """A Hugging Face tokenizer; one that cannot load is an error line, or LookupError when not required."""
    try:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(name)
    except Exception as e:
        if not required:
            raise LookupError(name) from e
        die(f"cannot load the tokenizer '{name}' (a Hugging Face tokenizer name or directory, or 'gpt2'): "
            f"{first_line(e)}")

    def encode(text):
        try:  # special tokens on: a Llama prompt starts with its BOS token, as the model was trained
            return tok.encode(text)
        except Exception as e:  # e.g. a character vocabulary without an unknown token
            die(f"{source} cannot encode the prompt: {str(e).splitlines()[0][:200]}")
    return Tokenizer(encode, lambda ids: tok.decode(ids, skip_special_tokens=True), len(tok), source)


GPT2_FILES = 'https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/'  # tiktoken's source and cache key


def char_tokenizer(chars):
    """A transformers tokenizer of one token per character (id: its place in chars), joined back without spaces."""
    from tokenizers import Regex, Tokenizer as RawTokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    raw = RawTokenizer(models.WordLevel({c: i for i, c in enumerate(chars)}, unk_token=None))
    raw.pre_tokenizer = pre_tokenizers.Split(Regex(r'[\s\S]'), behavior='isolated')
    raw.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=raw)


def hf_tokenizer(config):
    """A run's tokenizer as transformers loads it, from the run's config (a checkpoint's 'config'): its
    dataset's character vocabulary, GPT-2's BPE (tiktoken's own files), or the pretrained model's tokenizer;
    None when the run does not say."""
    dataset, init_from = config.get('dataset'), config.get('init_from')
    meta_path = os.path.join('data', dataset, 'meta.json') if dataset else None
    if meta_path and os.path.exists(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
        if meta.get('kind') == 'char' and not meta.get('chars'):
            raise ValueError(f"'{meta_path}' is a character vocabulary without its 'chars' list (rerun the "
                             f"dataset's prepare.py)")
        if meta.get('kind') == 'char':
            return char_tokenizer(meta['chars'])
        if 'ids' in meta:
            raise ValueError(f"'{meta_path}' renumbers GPT-2's ids (its 'ids'), which no transformers tokenizer "
                             f"reads")
        if meta.get('encoding') == 'gpt2':  # GPT-2's vocab.json and merges.txt are tiktoken's (cached) files
            import tempfile

            from tiktoken.load import read_file_cached
            from transformers import GPT2Tokenizer
            with tempfile.TemporaryDirectory() as d:
                for name, source in (('vocab.json', 'encoder.json'), ('merges.txt', 'vocab.bpe')):
                    with open(os.path.join(d, name), 'wb') as f:
                        f.write(read_file_cached(GPT2_FILES + source))
                return GPT2Tokenizer.from_pretrained(d)
    if init_from not in (None, 'scratch', 'resume'):
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(init_from)
    return None


def token_bytes(meta, vocab_size):
    """The UTF-8 bytes of text each token id stands for (a list of vocab_size ints), for bits per byte: a character
    vocabulary's characters, or tiktoken's pieces (its special tokens and the ids past them, padding: 0, as nanochat
    counts them); None for a task's ids, which stand for no text."""
    kind = meta.get('kind', 'tiktoken')
    if 'example_length' in meta or kind not in ('char', 'tiktoken'):
        return None
    if kind == 'char':
        pieces = [len(c.encode('utf-8')) for c in meta['chars']]
    else:
        import tiktoken
        try:
            enc = tiktoken.get_encoding(meta.get('encoding', 'gpt2'))
        except Exception:  # offline without the cache: the run goes on without bits per byte
            return None
        special = {enc.encode_single_token(s) for s in enc.special_tokens_set}
        ids = meta.get('ids', range(enc.n_vocab))  # a renumbered vocabulary's are GPT-2's
        if 'ids' in meta and not renumbering_ok(ids, enc.n_vocab):
            return None  # a damaged list: no bits per byte (load_tokenizer says why in one line)
        pieces = [0 if i in special else len(enc.decode_single_token_bytes(i)) for i in ids]
    return (pieces + [0] * vocab_size)[:vocab_size]
