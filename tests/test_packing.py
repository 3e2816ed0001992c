"""Packing: row layout, packed loss == unpacked loss (a real tiny model), exact iterator state."""

import json

import grain
import jax
import numpy as np
import pytest

from mimesis_jax import models
from mimesis_jax.algorithms.logprobs import token_logprobs
from mimesis_jax.data.midtrain import midtrain_example
from mimesis_jax.data.packing import FirstFitPacker, PackIterDataset, fit_length, pack_examples
from mimesis_jax.data.tokenizer import load_tokenizer, samples_dir
from mimesis_jax.models import ModelConfig
from mimesis_jax.train.step import lm_loss_sums


def _ex(tokens, mask):
    return {"tokens": np.asarray(tokens, np.int32), "loss_mask": np.asarray(mask, np.int32)}


def test_row_layout():
    a, b, c = _ex([5, 6, 7], [0, 1, 1]), _ex([8, 9], [0, 1]), _ex([1, 2, 3, 4], [0, 0, 1, 1])
    out = pack_examples([a, b, c], seq_len=6, pad_id=99)
    # first fit: a -> row 0, b -> row 1? no: b fits after a in row 0 (3 + 2 <= 6); c opens row 1
    np.testing.assert_array_equal(out["tokens"], [[5, 6, 7, 8, 9, 99], [1, 2, 3, 4, 99, 99]])
    np.testing.assert_array_equal(out["positions"], [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 0]])
    np.testing.assert_array_equal(out["segment_ids"], [[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 0, 0]])
    np.testing.assert_array_equal(out["loss_mask"], [[0, 1, 1, 0, 1, 0], [0, 0, 1, 1, 0, 0]])
    assert out["loss_mask"].dtype == np.float32 and out["tokens"].dtype == np.int32
    one = pack_examples([a, b, c], seq_len=6, pad_id=99, packing=False)
    assert one["tokens"].shape == (3, 6) and (one["segment_ids"].max(axis=1) == 1).all()


def test_first_fit_uses_earlier_rows_and_rejects_when_full():
    p = FirstFitPacker(seq_len=10, num_bins=2, pad_id=0)
    assert p.add(_ex(range(7), [1] * 7)) and p.add(_ex(range(6), [1] * 6))   # rows: 7, 6
    assert p.add(_ex(range(3), [1] * 3))  # fits row 0 (7 + 3)
    assert not p.add(_ex(range(5), [1] * 5))  # fits nowhere and no row left
    assert [len(r) for r in p.bins] == [2, 1]
    with pytest.raises(ValueError, match="longer than seq_len"):
        p.add(_ex(range(11), [1] * 11))


def test_fit_length():
    ex = _ex(range(10), [0] * 5 + [1] * 5)
    cut = fit_length(ex, 6, "truncate")
    assert cut["tokens"].tolist() == list(range(6)) and cut["loss_mask"].tolist() == [0] * 5 + [1]
    assert fit_length(ex, 6, "skip") is None and fit_length(ex, 10, "error") is ex
    with pytest.raises(ValueError, match="f.jsonl record 2: 10 tokens exceed seq_len=6"):
        fit_length(ex, 6, "error", "f.jsonl record 2")


def test_packed_loss_equals_unpacked_loss(tmp_path):
    tok = load_tokenizer("tiny", cache_dir=str(tmp_path))
    with open(f"{samples_dir()}/midtrain_everyday.jsonl", encoding="utf-8") as f:
        examples = [midtrain_example(tok, json.loads(next(f))) for _ in range(7)]
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, initializer_range=0.2,
                      logits_seq_chunk=64, logits_vocab_chunk=256)
    params = models.init_params(cfg, jax.random.key(0))
    seq_len = max(len(e["tokens"]) for e in examples) + 40
    packed = pack_examples(examples, seq_len, tok.pad_id)
    assert packed["tokens"].shape[0] < len(examples)  # rows really hold several conversations
    nll_packed, n_packed = lm_loss_sums(cfg, params, packed)
    # Reference: each example alone in its own row, right-padded, no segment ids or positions: causal attention means
    # the padding after an example cannot change its log-probs, so this is the plain unpacked computation.
    ref = np.full((len(examples), seq_len), tok.pad_id, np.int32)
    for i, e in enumerate(examples):
        ref[i, :len(e["tokens"])] = e["tokens"]
    lp = np.asarray(token_logprobs(cfg, params, ref), np.float64)
    nll_ref, n_ref = 0.0, 0
    for i, e in enumerate(examples):
        w = e["loss_mask"][1:].astype(np.float64)
        nll_ref -= float((lp[i, :len(w)] * w).sum())
        n_ref += int(w.sum())
    assert int(n_packed) == n_ref
    np.testing.assert_allclose(float(nll_packed), nll_ref, rtol=2e-5)
    # And one example per row (padding only) gives the same sums.
    nll_one, n_one = lm_loss_sums(cfg, params, pack_examples(examples, seq_len, tok.pad_id, packing=False))
    assert int(n_one) == n_ref
    np.testing.assert_allclose(float(nll_one), nll_ref, rtol=2e-5)


def _stream(n=60, seed=0):
    rng = np.random.RandomState(seed)
    items = []
    for i in range(n):
        if i % 7 == 3:
            items.append({"_skip": True, "_stats": {"skipped_records": 1}})
        else:
            k = int(rng.randint(2, 12))
            items.append({"tokens": np.full(k, i, np.int32), "loss_mask": np.ones(k, np.int32),
                          "_stats": {"examples": 1}})
    return grain.MapDataset.source(items).to_iter_dataset(grain.ReadOptions(num_threads=0))


@pytest.mark.parametrize("packing", [True, False])
def test_pack_iterator_state_is_exact(packing):
    ds = PackIterDataset(_stream(), seq_len=16, pad_id=0, num_bins=3, packing=packing)
    full = list(ds.__iter__())
    every_example = sorted(int(t) for r in full for s in range(1, r["segment_ids"].max() + 1)
                           for t in set(r["tokens"][r["segment_ids"] == s].tolist()))
    assert every_example == [i for i in range(60) if i % 7 != 3]  # each example exactly once, markers dropped
    assert full[-1]["_stats"] == {"examples": 51, "skipped_records": 9}
    for cut in range(len(full) + 1):
        it = ds.__iter__()
        for _ in range(cut):
            next(it)
        state = json.loads(json.dumps(it.get_state()))
        it2 = PackIterDataset(_stream(), seq_len=16, pad_id=0, num_bins=3, packing=packing).__iter__()
        it2.set_state(state)
        rest = list(it2)
        assert len(rest) == len(full) - cut
        for a, b in zip(rest, full[cut:]):
            for k in ("tokens", "positions", "segment_ids", "loss_mask"):
                np.testing.assert_array_equal(a[k], b[k])
            assert a["_stats"] == b["_stats"]
