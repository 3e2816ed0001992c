"""Tokenizers travel with exported models (issue #24 item 4): `export` writes a tokenizer that
transformers.AutoTokenizer loads with the project tokenizer's ids; `serve` / `rollout` use a checkpoint's own
tokenizer; a tokenizer whose ids differ from the checkpoint's is a one-line error (rc 2 from the CLI)."""

from __future__ import annotations

import os
import re
import shutil

import jax
import pytest

from mimesis_jax import models
from mimesis_jax.data.tokenizer import (CHAT_CONTROL_TOKENS, ENDOFTEXT, TINY_SYMBOLS, HFTokenizer, load_tokenizer,
                                        save_hf_tokenizer, tiny_training_lines, train_tiny_sentencepiece)
from mimesis_jax.errors import ConfigError
from mimesis_jax.models.config import ModelConfig

TEXTS = [
    "Hello world",
    "  two  spaces  and a trailing space ",
    "Café naïve Ünïcödé ñ über",
    "emoji 😀🚀 and CJK 日本語",
    "digits 2024-07-01 09:30, tabs\tand\nnewlines\r\n",
    "<|im_start|>system\nYou are a customer.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nthinking</think>\n<tool_call>{\"name\": \"lookup\"}</tool_call><|im_end|>"
    "<|endoftext|>",
    "<tool_response>ok</tool_response> <unk> <s> </s>",
]
BYTE0 = 1 + len(TINY_SYMBOLS)  # tiny: <unk> is 0, the chat symbols 1..9, then the 256 byte pieces <0x00>..<0xFF>


@pytest.fixture(scope="module")
def tiny():
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def exported(tiny, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("tok"))
    written = save_hf_tokenizer(tiny, out, source="tiny")
    assert written == ["tokenizer.json", "tokenizer_config.json", "tokenizer.model", "mimesis_tokenizer.json"]
    return out


def test_autotokenizer_gives_the_project_ids(tiny, exported):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(exported, local_files_only=True)
    for text in TEXTS:
        want = tiny.encode(text)
        assert hf.encode(text, add_special_tokens=False) == want, text
        assert hf(text)["input_ids"] == want, text  # no BOS/EOS added by default either
        assert hf.decode(want) == tiny.decode(want) == text
    # the ids themselves, from the tiny model's layout: symbols at 1..9, bytes at BYTE0 + byte value
    assert hf.encode("<|im_start|><|im_end|><think></think>" + ENDOFTEXT) == [2, 3, 4, 5, 1]
    assert [hf.convert_tokens_to_ids(t) for t in CHAT_CONTROL_TOKENS] == list(range(2, 10))
    assert hf.encode("😀") == [BYTE0 + b for b in "😀".encode()] == [250, 169, 162, 138]
    assert hf.encode("é") == [BYTE0 + 0xC3, BYTE0 + 0xA9]
    assert hf.eos_token == "<|im_end|>" and hf.pad_token == ENDOFTEXT and hf.bos_token is None
    assert len(hf) == tiny.vocab_size == 1024


def test_every_sample_line_gets_the_same_ids(tiny, exported):
    hf = load_tokenizer("hf:" + exported)
    lines = tiny_training_lines()
    assert len(lines) > 3000
    assert [hf.encode(s) for s in lines] == [tiny.encode(s) for s in lines]
    assert hf.fingerprint() == tiny.fingerprint()


def test_a_hf_tokenizer_is_copied_and_keeps_its_ids(exported, tmp_path):
    src = HFTokenizer(exported)
    out = str(tmp_path / "copy")
    assert save_hf_tokenizer(src, out, source="hf:x")[-1] == "mimesis_tokenizer.json"
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert [hf.encode(t, add_special_tokens=False) for t in TEXTS] == [src.encode(t) for t in TEXTS]


@pytest.fixture(scope="module")
def run(tiny, tmp_path_factory):
    """A one-step training workdir whose run config names the tiny tokenizer, and its export."""
    from mimesis_jax.config import CheckpointConfig, MeshConfig, OptimizerConfig, RunConfig, TrainConfig
    from mimesis_jax.train.export import export_hf
    from mimesis_jax.train.loop import train
    from mimesis_jax.train.synthetic import SyntheticData

    model = ModelConfig(vocab_size=1024, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, logits_seq_chunk=16,
                        logits_vocab_chunk=256)
    cfg = RunConfig(stage="midtrain", model=model, data=SyntheticData(vocab_size=1024, seq_len=16),
                    optimizer=OptimizerConfig(lr=1e-2, warmup_steps=0, schedule="constant"),
                    train=TrainConfig(steps=1, global_batch=2, dtype="float32", progress_bar=False,
                                      tensorboard=False),
                    mesh=MeshConfig(data=1, fsdp=1, tensor=1), checkpoint=CheckpointConfig(every=1, keep=2))
    wd = str(tmp_path_factory.mktemp("run"))
    train(cfg, wd, handle_signals=False)
    out = str(tmp_path_factory.mktemp("hf"))
    logs = []
    export_hf(wd, out, log=logs.append)
    assert logs[0] == ("export: tokenizer 'tiny': wrote tokenizer.json, tokenizer_config.json, tokenizer.model, "
                       "mimesis_tokenizer.json")
    return wd, out


def test_serve_and_rollout_use_the_exported_tokenizer(tiny, run):
    from mimesis_jax.chat.loading import load_chat_model
    from mimesis_jax.chat.specs import ModelSpec, local_model

    wd, out = run
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(out, local_files_only=True)
    want = [tiny.encode(t) for t in TEXTS]
    assert [hf.encode(t, add_special_tokens=False) for t in TEXTS] == want
    served = load_chat_model(out)
    assert served.tok.name == out and [served.tok.encode(t) for t in TEXTS] == want
    rolled = local_model(ModelSpec(out), role="assistant")
    assert [rolled.tok.encode(t) for t in TEXTS] == want
    from_run = load_chat_model(wd)
    assert from_run.tok.name == "tiny"
    # the tokenizer given explicitly with the same ids is accepted
    assert load_chat_model(out, tokenizer="tiny").tok.name == "tiny"
    assert load_chat_model(wd, tokenizer="hf:" + out).tok.name == out


def test_an_old_export_with_only_tokenizer_model_is_read_as_sentencepiece(tiny, run, tmp_path):
    from mimesis_jax.chat.loading import dir_tokenizer_spec, load_chat_model

    old = str(tmp_path / "old")
    os.makedirs(old)
    for fn in ("config.json", "model.safetensors", "tokenizer.model"):
        shutil.copyfile(os.path.join(run[1], fn), os.path.join(old, fn))
    assert dir_tokenizer_spec(old) == f"sentencepiece:{old}/tokenizer.model"
    text = "Café, my parcel is late 😀<|im_end|>"
    assert load_chat_model(old).tok.encode(text) == tiny.encode(text)


@pytest.fixture(scope="module")
def other_sp(tmp_path_factory):
    """A different sentencepiece model (512 pieces) whose ids fit the 1024-id model but are not the run's."""
    path = train_tiny_sentencepiece(str(tmp_path_factory.mktemp("sp512")), tiny_training_lines(), vocab_size=512)
    return "sentencepiece:" + path


def test_a_tokenizer_with_other_ids_is_a_named_error(run, other_sp, tiny):
    from mimesis_jax.chat.loading import load_chat_model

    wd, out = run
    other = load_tokenizer(other_sp)
    with pytest.raises(ConfigError) as e:
        load_chat_model(out, tokenizer=other_sp)
    record = os.path.join(out, "mimesis_tokenizer.json")
    assert str(e.value) == (f"tokenizer mismatch: --checkpoint {out} was trained with tokenizer 'tiny' (recorded "
                            f"in {record}), 1024 ids, fingerprint {tiny.fingerprint()}; --tokenizer {other_sp} has "
                            f"512 ids, fingerprint {other.fingerprint()}")
    with pytest.raises(ConfigError, match=re.escape(f"--checkpoint {wd} was trained with tokenizer 'tiny' (the "
                                                    f"checkpoint's own), 1024 ids")):
        load_chat_model(wd, tokenizer=other_sp)


def test_too_many_ids_is_a_named_error(tmp_path, other_sp):
    from mimesis_jax.chat.loading import load_chat_model

    config = ModelConfig(vocab_size=256, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    models.save_hf(str(tmp_path), config, models.init_params(config, jax.random.key(0)))
    with pytest.raises(ConfigError, match=re.escape(f"tokenizer mismatch: --tokenizer {other_sp} has 512 ids, more "
                                                    f"than the model's vocab_size 256 ({tmp_path}/config.json)")):
        load_chat_model(str(tmp_path), tokenizer=other_sp)


def test_cli_mismatch_is_one_line_and_rc_2(run, other_sp, capsys):
    from mimesis_jax.cli import main

    wd, out = run
    assert main(["serve", "--checkpoint", out, "--tokenizer", other_sp, "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: tokenizer mismatch: --checkpoint {out} was trained with "
                                               "tokenizer 'tiny'")
    assert main(["rollout", "--agent", wd, "--agent-tokenizer", other_sp, "--user", "tiny", "--gyms", "TurtleGym",
                 "--n", "1", "--out", os.path.join(wd, "r.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: tokenizer mismatch: --checkpoint {wd} was trained with "
                                               "tokenizer 'tiny' (the checkpoint's own)"), err
