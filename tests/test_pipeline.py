"""Grain pipeline: exact resume, mixture proportions, disjoint host shards, readers, named errors."""

import json
import logging
import os

import numpy as np
import pytest

from mimesis_jax.data.midtrain import RecordError
from mimesis_jax.data.pipeline import DataConfig, SourceConfig, decode_row, make_iterator
from mimesis_jax.data.tokenizer import load_tokenizer, samples_dir
from mimesis_jax.errors import ConfigError

KEYS = ("tokens", "positions", "segment_ids", "loss_mask")


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return load_tokenizer("tiny", cache_dir=str(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="module")
def hf_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("hf"))


def _write_jsonl(path, records):
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return str(path)


def _token_records(source: int, n: int, length: int = 6):
    """Pre-tokenized records whose tokens name (source, record): first token 100 + source, then the record id."""
    return [{"tokens": [100 + source] + [1 + i % 90] * (length - 1), "loss_mask": [0] + [1] * (length - 1)}
            for i in range(n)]


def _examples(batch):
    """(first token, second token) of every packed example in a batch."""
    out = []
    for row in range(batch["tokens"].shape[0]):
        seg = batch["segment_ids"][row]
        for s in range(1, seg.max() + 1):
            t = batch["tokens"][row][seg == s]
            out.append((int(t[0]), int(t[1])))
    return out


def _equal(a, b):
    return all(np.array_equal(a[k], b[k]) for k in KEYS)


def test_resume_is_exact_at_every_cut(tok, hf_cache):
    cfg = DataConfig(sources=(SourceConfig(f"{samples_dir()}/midtrain_everyday.jsonl", weight=2.0),
                              SourceConfig(f"{samples_dir()}/midtrain_support.jsonl")),
                     seq_len=192, pack_bins=4, cache_dir=hf_cache)
    it = make_iterator(cfg, tok, batch_size=3, seed=7)
    states, batches, stats = [], [], []
    for _ in range(14):
        states.append(json.loads(json.dumps(it.get_state())))
        batches.append(next(it))
        stats.append(it.stats)
    for cut in (0, 1, 4, 9):
        it2 = make_iterator(cfg, tok, batch_size=3, seed=7)
        it2.set_state(states[cut])
        for j in range(cut, 14):
            assert _equal(next(it2), batches[j]), (cut, j)
            assert it2.stats == stats[j]
    b = batches[0]
    assert {k: (v.shape, v.dtype.name) for k, v in b.items()} == {
        "tokens": ((3, 192), "int32"), "positions": ((3, 192), "int32"), "segment_ids": ((3, 192), "int32"),
        "loss_mask": ((3, 192), "float32")}
    assert stats[-1]["padding_fraction"] < 0.2 and stats[-1]["skipped_records"] == 0
    segs = decode_row(tok, b, 0)
    assert segs and all(s["text"].startswith("<|im_start|>") and s["targets"].endswith("<|im_end|>") for s in segs)
    assert not any("assistant" in s["targets"] or "<|im_start|>" in s["targets"] for s in segs)
    # Same seed -> same stream; another seed -> another order.
    assert _equal(next(make_iterator(cfg, tok, batch_size=3, seed=7)), batches[0])
    assert not _equal(next(make_iterator(cfg, tok, batch_size=3, seed=8)), batches[0])


def test_mixture_proportions_follow_weights(tok, hf_cache, tmp_path):
    weights = (1.0, 2.0, 5.0)
    sources = tuple(SourceConfig(_write_jsonl(tmp_path / f"s{d}.jsonl", _token_records(d, 40)), weight=w,
                                 format="tokens") for d, w in enumerate(weights))
    it = make_iterator(DataConfig(sources=sources, seq_len=64, cache_dir=hf_cache), tok, batch_size=16, seed=3)
    counts = np.zeros(3)
    while counts.sum() < 4000:
        for first, _ in _examples(next(it)):
            counts[first - 100] += 1
    frac = counts / counts.sum()
    np.testing.assert_allclose(frac, np.asarray(weights) / sum(weights), atol=0.03)  # > 4 binomial sd
    assert it.source_counts()["s2"] >= counts[2]  # drawn >= returned (the packer reads ahead)


def test_hosts_see_disjoint_shards_and_every_record_once(tok, hf_cache, tmp_path):
    path = _write_jsonl(tmp_path / "one.jsonl", _token_records(0, 45))
    seen = []
    for host in range(2):
        cfg = DataConfig(sources=(SourceConfig(path, format="tokens"),), seq_len=16, num_epochs=1, cache_dir=hf_cache)
        host_ids = [rid for b in make_iterator(cfg, tok, batch_size=4, seed=1, process_index=host, process_count=2)
                    for _, rid in _examples(b)]
        assert len(host_ids) == len(set(host_ids))
        seen.append(set(host_ids))
    assert not seen[0] & seen[1]
    assert seen[0] | seen[1] == {1 + i for i in range(45)}
    assert {len(s) for s in seen} == {22, 23}


def test_epochs_end_with_a_padded_or_dropped_batch(tok, hf_cache, tmp_path):
    path = _write_jsonl(tmp_path / "e.jsonl", _token_records(0, 10, length=8))
    base = DataConfig(sources=(SourceConfig(path, format="tokens"),), seq_len=8, num_epochs=2, cache_dir=hf_cache)
    batches = list(make_iterator(base, tok, batch_size=3, seed=0))
    assert len(batches) == 7  # 20 one-example rows -> 6 full batches + 1 with 2 rows and 1 empty row
    assert batches[-1]["segment_ids"][2].max() == 0 and batches[-1]["loss_mask"][2].sum() == 0
    ids = [rid for b in batches for _, rid in _examples(b)]
    assert sorted(ids) == sorted(list(range(1, 11)) * 2)
    assert ids[:10] != ids[10:]  # the second epoch is reshuffled
    dropped = list(make_iterator(DataConfig(**{**base.__dict__, "drop_remainder": True}), tok, batch_size=3, seed=0))
    assert len(dropped) == 6


def test_bad_record_error_names_file_and_index(tok, hf_cache, tmp_path):
    good = {"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]}
    path = _write_jsonl(tmp_path / "bad.jsonl", [good, good, "{not json", good])
    for threads in (0, 2):
        cfg = DataConfig(sources=(SourceConfig(path),), seq_len=64, shuffle=False, read_threads=threads,
                         cache_dir=hf_cache)
        with pytest.raises(RecordError, match=r"bad\.jsonl record 2 \(line 3\): invalid JSON"):
            list(make_iterator(cfg, tok, batch_size=2, seed=0))
    path2 = _write_jsonl(tmp_path / "role.jsonl", [good, {"messages": [{"role": "narrator", "content": "x"}]}])
    cfg = DataConfig(sources=(SourceConfig(path2),), seq_len=64, shuffle=False, num_epochs=1, cache_dir=hf_cache)
    with pytest.raises(RecordError, match=r"role\.jsonl record 1 \(line 2\): messages\[0\]: unknown role"):
        list(make_iterator(cfg, tok, batch_size=2, seed=0))


def test_skipped_records_are_logged_and_counted_exactly(tok, hf_cache, tmp_path, caplog):
    good = {"messages": [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "hi"}]}
    recs = [good] * 20
    for i in (3, 11, 17):
        recs[i] = "" if i == 11 else {"messages": []}
    path = _write_jsonl(tmp_path / "mixed.jsonl", recs)
    cfg = DataConfig(sources=(SourceConfig(path),), seq_len=32, pack_bins=2, num_epochs=1, skip_bad_records=True,
                     cache_dir=hf_cache)
    with caplog.at_level(logging.WARNING, logger="mimesis_jax.data.pipeline"):
        batches = list(make_iterator(cfg, tok, batch_size=2, seed=0))
    warned = [r.getMessage() for r in caplog.records if "skipping bad record" in r.getMessage()]
    assert len(warned) == 3 and any("mixed.jsonl record 11 (line 12): empty line" in w for w in warned)
    it = make_iterator(cfg, tok, batch_size=2, seed=0)
    states = []
    for _ in batches:
        next(it)
        states.append(it.get_state())
    assert it.stats["skipped_records"] == 3 and it.stats["examples"] == 17
    for cut in range(len(states)):  # the counter survives a restore without double counting
        it2 = make_iterator(cfg, tok, batch_size=2, seed=0)
        it2.set_state(states[cut])
        for _ in it2:
            pass
        assert it2.stats["skipped_records"] == 3 and it2.stats["examples"] == 17


def test_overlong_examples(tok, hf_cache, tmp_path):
    long = {"messages": [{"role": "user", "content": "word " * 60}, {"role": "assistant", "content": "ok"},
                         {"role": "user", "content": "and more"}]}
    short = {"messages": [{"role": "user", "content": "hi"}]}
    path = _write_jsonl(tmp_path / "long.jsonl", [long, short])
    base = dict(sources=(SourceConfig(path),), seq_len=24, num_epochs=1, shuffle=False, cache_dir=hf_cache)
    it = make_iterator(DataConfig(**base), tok, batch_size=2, seed=0)
    b = next(it)
    assert it.stats["truncated_examples"] == 1 and (b["segment_ids"] > 0).sum() == 24 + len(
        tok.encode("user\nhi")) + 3
    it = make_iterator(DataConfig(**base, overlong="skip"), tok, batch_size=2, seed=0)
    next(it)
    assert it.stats["overlong_skipped"] == 1 and it.stats["examples"] == 1
    with pytest.raises(ValueError, match=r"long\.jsonl record 0 \(line 1\): \d+ tokens exceed seq_len=24"):
        next(make_iterator(DataConfig(**base, overlong="error"), tok, batch_size=2, seed=0))


def test_parquet_arrow_and_save_to_disk_read_like_jsonl(tok, hf_cache, tmp_path):
    import datasets

    with open(f"{samples_dir()}/thoughttrace_sample.jsonl", encoding="utf-8") as f:
        records = [json.loads(line) for line in f][:24]
    jsonl = _write_jsonl(tmp_path / "tt.jsonl", records)
    ds = datasets.Dataset.from_list(records)
    ds.to_parquet(str(tmp_path / "tt.parquet"))
    ds.save_to_disk(str(tmp_path / "tt_disk"))
    arrow = [os.path.join(tmp_path / "tt_disk", f) for f in os.listdir(tmp_path / "tt_disk") if f.endswith(".arrow")]
    runs = []
    for path in (jsonl, str(tmp_path / "tt.parquet"), arrow[0], str(tmp_path / "tt_disk")):
        cfg = DataConfig(sources=(SourceConfig(path, format="thoughttrace", name="tt"),), seq_len=512,
                         num_epochs=1, cache_dir=hf_cache)
        runs.append(list(make_iterator(cfg, tok, batch_size=2, seed=5)))
    for other in runs[1:]:
        assert len(other) == len(runs[0]) and all(_equal(a, b) for a, b in zip(other, runs[0]))
    targets = runs[0][0]["tokens"][runs[0][0]["loss_mask"] > 0]
    assert tok.think_start_id in targets and tok.im_end_id in targets


def test_threads_do_not_change_the_stream(tok, hf_cache):
    base = dict(sources=(SourceConfig(f"{samples_dir()}/midtrain_support.jsonl"),), seq_len=128, cache_dir=hf_cache)
    a = make_iterator(DataConfig(**base), tok, batch_size=2, seed=2)
    b = make_iterator(DataConfig(**base, read_threads=3), tok, batch_size=2, seed=2)
    for _ in range(6):
        assert _equal(next(a), next(b))
    b.set_state(a.get_state())  # read_threads is not part of the stream's identity
    assert _equal(next(a), next(b))


def test_state_from_another_configuration_is_rejected(tok, hf_cache):
    src = (SourceConfig(f"{samples_dir()}/midtrain_support.jsonl"),)
    a = make_iterator(DataConfig(sources=src, seq_len=128, cache_dir=hf_cache), tok, batch_size=2, seed=0)
    b = make_iterator(DataConfig(sources=src, seq_len=256, cache_dir=hf_cache), tok, batch_size=2, seed=0)
    with pytest.raises(ValueError, match="different data configuration"):
        b.set_state(a.get_state())
    with pytest.raises(ValueError, match="expected version"):
        b.set_state({"rows": {}})


@pytest.mark.parametrize("change,match", [
    (dict(sources=()), "data.sources': needs at least one"),
    (dict(sources=(SourceConfig("x.jsonl", weight=0.0),)), "data.sources.0.weight': must be a finite number > 0"),
    (dict(sources=(SourceConfig("a.jsonl"), SourceConfig("b.jsonl", weight=-1))), "data.sources.1.weight"),
    (dict(sources=(SourceConfig("a.jsonl", format="chatml"),)), "data.sources.0.format': must be one of"),
    (dict(sources=(SourceConfig("d1/a.jsonl"), SourceConfig("d2/a.jsonl"))), "source names must be unique"),
    (dict(seq_len=1), "data.seq_len'"),
    (dict(pack_bins=0), "data.pack_bins'"),
    (dict(num_epochs=0), "data.num_epochs'"),
    (dict(overlong="wrap"), "data.overlong'"),
    (dict(sources=(SourceConfig("/nonexistent/*.jsonl"),)), "data.sources.0.path': no file or directory matches"),
])
def test_bad_configs_name_the_key(tok, change, match):
    cfg = DataConfig(**{"sources": (SourceConfig(f"{samples_dir()}/midtrain_support.jsonl"),), **change})
    with pytest.raises(ConfigError, match=match):
        make_iterator(cfg, tok, batch_size=2, seed=0)


def test_too_few_records_for_the_hosts(tok, hf_cache, tmp_path):
    path = _write_jsonl(tmp_path / "tiny.jsonl", _token_records(0, 2))
    cfg = DataConfig(sources=(SourceConfig(path, format="tokens"),), seq_len=16, cache_dir=hf_cache)
    with pytest.raises(ConfigError, match="2 records cannot be split over 4 processes"):
        make_iterator(cfg, tok, batch_size=1, seed=0, process_index=0, process_count=4)
