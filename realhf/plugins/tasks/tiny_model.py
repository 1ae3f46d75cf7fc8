"""The tiny task's tokenizer and random-init Qwen2 model (see NOTES, tiny task).

Tokenizer: 4 specials, every printable ASCII character and "\\n" as a single token (so numbers
are spelled digit by digit, which is what makes arithmetic learnable by a 0.5M-parameter model),
and every task word with and without its leading space as one token.

It is a byte-level BPE laid out exactly like Qwen2's (NFC, Qwen2's split regex, ByteLevel), not
a word-level model, because transformers 5 loads any `model_type: qwen2` directory through
`Qwen2Tokenizer`, which keeps only the vocabulary and merges of tokenizer.json and rebuilds the
rest as Qwen2's pipeline: a word-level tokenizer.json silently loses its spaces that way. Built
like this, `AutoTokenizer` and `PreTrainedTokenizerFast` load the same tokenizer. The price is
the BPE intermediates of the words ("sh", "she", ...), which never occur in task text.

Text outside printable ASCII and newline (tabs, non-ASCII) has no token and is dropped on
encoding; every dataset text decodes back exactly.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Dict, Iterable, List, Sequence, Tuple

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)  # ids 0..3 in this order
# Printable ASCII (space .. "~") plus newline; string.printable also has \t\r\x0b\x0c, which the
# task never produces.
CHARS = tuple(chr(c) for c in range(32, 127)) + ("\n",)
# Qwen2's pre-tokenizer split (transformers' tokenization_qwen2.PRETOKENIZE_REGEX): letters runs
# with one optional leading non-letter, single digits, punctuation runs, whitespace.
QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def _bytes_to_unicode() -> Dict[int, str]:
    """GPT-2's byte-level alphabet: printable Latin-1 bytes stand for themselves, the others are
    shifted past 255 (space -> "\u0120", newline -> "\u010a")."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, shift = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + shift)
            shift += 1
    return table


_BYTE = _bytes_to_unicode()


def _bl(text: str) -> str:
    """`text` in the byte-level alphabet."""
    return "".join(_BYTE[b] for b in text.encode("utf-8"))


def _bpe(symbols: Sequence[str], ranks: Dict[Tuple[str, str], int]) -> List[str]:
    """Apply BPE merges the way `tokenizers` does: lowest rank first, leftmost on ties."""
    syms = list(symbols)
    while len(syms) > 1:
        candidates = [(ranks[p], i) for i, p in enumerate(zip(syms, syms[1:])) if p in ranks]
        if not candidates:
            break
        _, i = min(candidates)
        syms[i : i + 2] = [syms[i] + syms[i + 1]]
    return syms


def _learn_merges(words: Sequence[str]) -> List[Tuple[str, str]]:
    """Merges that turn each word (and each word with a leading space) into a single token.

    Bare words first, by greedy most-frequent-pair BPE over the word list, so the intermediates
    are shared; then one merge ("\u0120", word) per word. Because no bare-word merge involves
    the space symbol, a spaced word first collapses to (space, word) and then to one token.
    """
    merges: List[Tuple[str, str]] = []
    ranks: Dict[Tuple[str, str], int] = {}
    todo = [_bl(w) for w in words]
    while True:
        segs = [_bpe(list(w), ranks) for w in todo]
        unfinished = [s for s in segs if len(s) > 1]
        if not unfinished:
            break
        counts = Counter(p for s in unfinished for p in zip(s, s[1:]))
        pair = min(counts, key=lambda p: (-counts[p], p))
        ranks[pair] = len(merges)
        merges.append(pair)
    return merges + [(_bl(" "), _bl(w)) for w in words]


def build_tokenizer(words: Iterable[str], model_max_length: int = 256) -> PreTrainedTokenizerFast:
    words = [w for w in dict.fromkeys(words) if len(w) > 1]  # single letters are already chars
    for w in words:
        if not re.fullmatch(r"[A-Za-z]+", w):
            raise ValueError(f"tokenizer words must be ASCII letters only, got {w!r}")
    merges = _learn_merges(words)
    pieces: List[str] = list(SPECIALS) + [_bl(c) for c in CHARS] + [a + b for a, b in merges]
    vocab: Dict[str, int] = {p: i for i, p in enumerate(dict.fromkeys(pieces))}

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, fuse_unk=False, byte_fallback=False))
    # Exactly Qwen2Tokenizer's pipeline (see the module docstring).
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS))

    for w in words:  # the merges must leave every task word as one token
        for form in (w, " " + w):
            if len(tok.encode(form).ids) != 1:
                raise RuntimeError(f"BPE merges split {form!r} into {tok.encode(form).tokens}")

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        # The default clean-up would turn " ." into "." and break exact round trips.
        clean_up_tokenization_spaces=False,
        padding_side="left",  # generation pads on the left; training code pads explicitly
        model_max_length=model_max_length,
    )


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> None:
    tokenizer.save_pretrained(str(out_dir))
    # Older transformers pick the tokenizer class from this field.
    cfg_path = Path(out_dir) / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def build_model(
    tokenizer: PreTrainedTokenizerFast, seed: int = 1, n_layers: int = 2, max_positions: int = 256
) -> Qwen2ForCausalLM:
    """Random-init Qwen2: `n_layers` layers (2: ~0.55M parameters), hidden 128, 4 heads, tied
    embeddings; `max_positions` is the longest sequence it is meant for (RoPE: config only)."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=n_layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model


def save_model_dir(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> None:
    """An HF directory: config.json, generation_config.json, model.safetensors, tokenizer files."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    save_tokenizer(tokenizer, out_dir)
