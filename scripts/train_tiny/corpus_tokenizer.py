"""Build the training corpus and train the byte-level BPE tokenizer.

Corpus: the Python standard library sources of the running interpreter,
library modules in sorted relative-path order, then the test suites in the
same order, capped at --max-bytes. Every 40th file
is held out. About 10% of the training files also appear wrapped in a
ChatML exchange so the model sees <|im_start|>/<|im_end|> and the template's
empty think block. With --edit-pairs N (0 by default, so the committed tiny
models' corpus is unchanged) each training file also gives up to N rename-edit
examples (edit_pairs.py): the speculative-decoding target learns to quote code
back with a change, as code models do.

Writes to --out: tokenizer/ (tokenizer.json, tokenizer_config.json),
train_ids.npy, heldout_ids.npy (uint16 token streams, documents separated by
<|endoftext|>), corpus_manifest.json.
"""
import argparse
import hashlib
import json
import os
import random
import sys
import sysconfig
import time

from edit_pairs import edit_pairs

# Exact pre-tokenizer regex of Qwen2/Qwen3 (design spec section 1).
QWEN2_PATTERN = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
                 r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added but not special, as in Qwen3's tokenizer.json.
EXTRA_TOKENS = ["<tool_call>", "</tool_call>", "<think>", "</think>"]
SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__",
             "idlelib", "lib2to3", "ensurepip", "turtledemo"}
HELDOUT_EVERY = 50
CHAT_EVERY = 10


def list_stdlib_files(min_bytes=200, max_file_bytes=1_000_000):
    root = sysconfig.get_paths()["stdlib"]
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in filenames:
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            size = os.path.getsize(path)
            if min_bytes <= size <= max_file_bytes:
                found.append((os.path.relpath(path, root), path))
    # Library modules first, then test suites, so the byte cap cuts tests.
    found.sort(key=lambda item: (is_test_path(item[0]), item[0]))
    return root, found


def is_test_path(rel):
    parts = rel.split(os.sep)[:-1]
    return any(p in ("test", "tests") for p in parts)


def read_corpus(max_bytes):
    root, files = list_stdlib_files()
    docs = []
    total = 0
    for rel, path in files:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            text = f.read()
        if total + len(text.encode("utf-8")) > max_bytes:
            break
        total += len(text.encode("utf-8"))
        docs.append((rel, text))
    return root, docs, total


def chat_wrap(rel, text):
    """A ChatML exchange in the exact shape the Qwen3 template renders."""
    snippet = text[:1200]
    cut = snippet.rfind("\n")
    if cut > 200:
        snippet = snippet[:cut]
    module = rel[:-3].replace(os.sep, ".")
    return ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            f"<|im_start|>user\nShow the beginning of the Python module {module}.<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
            f"```python\n{snippet}\n```<|im_end|>\n")


def split_docs(docs, edits_per_file=0, seed=0):
    train, heldout, chats, edits = [], [], [], []
    rng = random.Random(seed)
    for i, (rel, text) in enumerate(docs):
        if i % HELDOUT_EVERY == HELDOUT_EVERY - 1:
            heldout.append(text)
            continue
        train.append(text)
        if i % CHAT_EVERY == 3:
            chats.append(chat_wrap(rel, text))
        edits.extend(edit_pairs(rel, text, rng, edits_per_file))
    return train, heldout, chats, edits


def build_tokenizer(train_texts, vocab_size):
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models,
                            normalizers, pre_tokenizers, processors, trainers)
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    try:
        tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False,
                                                  use_regex=False)
    except TypeError:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    n_added = len(SPECIAL_TOKENS) + len(EXTRA_TOKENS)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - n_added, min_frequency=2,
                                  show_progress=False, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(train_texts, trainer=trainer, length=len(train_texts))
    # Added after training so they get the highest ids, as in Qwen3.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in EXTRA_TOKENS])
    return tok


def tokenizer_config(tok, chat_template, max_length):
    decoder = {}
    for content in SPECIAL_TOKENS + EXTRA_TOKENS:
        decoder[str(tok.token_to_id(content))] = {
            "content": content, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": content in SPECIAL_TOKENS}
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": max_length,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def encode_stream(tok, texts, sep_id):
    import numpy as np
    out = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        out.extend(enc.ids)
        out.append(sep_id)
    return np.asarray(out, dtype=np.uint16)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--template", required=True, help="path of the Qwen3 chat template (jinja)")
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--max-bytes", type=int, default=24_000_000)
    ap.add_argument("--max-length", type=int, default=2048)
    ap.add_argument("--edit-pairs", type=int, default=0,
                    help="rename-edit examples per training file (edit_pairs.py); 0 keeps the plain corpus")
    args = ap.parse_args()
    import numpy as np
    t0 = time.time()
    os.makedirs(os.path.join(args.out, "tokenizer"), exist_ok=True)
    root, docs, total = read_corpus(args.max_bytes)
    train, heldout, chats, edits = split_docs(docs, args.edit_pairs)
    digest = hashlib.sha256("\0".join(t for _, t in docs).encode("utf-8")).hexdigest()
    print(f"corpus: {len(docs)} files, {total} bytes from {root}; train {len(train)}, "
          f"heldout {len(heldout)}, chat-wrapped {len(chats)}, edit pairs {len(edits)}; sha256 {digest[:16]}")
    tok = build_tokenizer(train, args.vocab_size)
    n = tok.get_vocab_size(with_added_tokens=True)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS + EXTRA_TOKENS}
    print(f"tokenizer: {n} tokens, added ids {ids}, trained in {time.time() - t0:.1f}s")
    if n != args.vocab_size:
        print(f"WARNING: vocab {n} != requested {args.vocab_size}")
    tok_dir = os.path.join(args.out, "tokenizer")
    tok.save(os.path.join(tok_dir, "tokenizer.json"))
    with open(args.template, "r", encoding="utf-8") as f:
        template = f.read()
    with open(os.path.join(tok_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(tok, template, args.max_length), f, indent=2, ensure_ascii=False)
    sep = ids["<|endoftext|>"]
    train_ids = encode_stream(tok, train + chats + edits, sep)
    heldout_ids = encode_stream(tok, heldout, sep)
    np.save(os.path.join(args.out, "train_ids.npy"), train_ids)
    np.save(os.path.join(args.out, "heldout_ids.npy"), heldout_ids)
    train_bytes = sum(len(t.encode("utf-8")) for t in train + chats + edits)
    manifest = {
        "source": "Python standard library .py files (sysconfig stdlib)", "root": root,
        "python": sys.version, "files": len(docs), "bytes": total, "sha256": digest,
        "skip_dirs": sorted(SKIP_DIRS), "heldout_rule": f"file index % {HELDOUT_EVERY} == {HELDOUT_EVERY - 1}",
        "chat_rule": f"training file index % {CHAT_EVERY} == 3 also added as a ChatML exchange",
        "edit_pairs_per_file": args.edit_pairs, "edit_pairs": len(edits),
        "edit_pairs_bytes": sum(len(t.encode("utf-8")) for t in edits),
        "train_files": len(train), "heldout_files": len(heldout), "chat_samples": len(chats),
        "train_tokens": int(train_ids.size), "heldout_tokens": int(heldout_ids.size),
        "bytes_per_token_train": round(train_bytes / max(1, train_ids.size), 3),
        "vocab_size": n, "token_ids": ids, "first_files": [r for r, _ in docs[:5]],
        "last_files": [r for r, _ in docs[-5:]],
    }
    with open(os.path.join(args.out, "corpus_manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    print(f"tokens: train {train_ids.size}, heldout {heldout_ids.size}; "
          f"{manifest['bytes_per_token_train']} bytes/token; total {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
