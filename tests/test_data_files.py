"""Data files are checked before training (issue #24 item 6): the first bad line is named with its file and line,
an empty or binary file is named, in one line with exit status 2 from the CLI; data/jsonio.py is the one reader."""

from __future__ import annotations

import json
import os

import pytest

from mimesis_jax.data import jsonio
from mimesis_jax.data.pipeline import DataConfig, SourceConfig, check_data_files
from mimesis_jax.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOOD = {"messages": [{"role": "user", "content": "my parcel is late"}, {"role": "assistant", "content": "sorry"}]}


def _write(path, lines) -> str:
    with open(path, "w", encoding="utf-8") as f:
        for x in lines:
            f.write((x if isinstance(x, str) else json.dumps(x)) + "\n")
    return str(path)


@pytest.fixture
def files(tmp_path):
    f = {
        "good": _write(tmp_path / "good.jsonl", [GOOD, "", GOOD]),
        "bad": _write(tmp_path / "bad.jsonl", [GOOD, GOOD, '{"messages": [oops', GOOD]),
        "field": _write(tmp_path / "field.jsonl", [GOOD, {"msgs": []}]),
        "array": _write(tmp_path / "array.jsonl", [GOOD, "[1, 2]"]),
        "blank": _write(tmp_path / "blank.jsonl", ["", "  "]),
    }
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "binary.jsonl").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    (tmp_path / "latin1.jsonl").write_bytes(json.dumps(GOOD).encode() + b'\n{"a": "caf\xe9"}\n')
    f.update(empty=str(tmp_path / "empty.jsonl"), binary=str(tmp_path / "binary.jsonl"),
             latin1=str(tmp_path / "latin1.jsonl"))
    return f


def test_reader_records_and_line_numbers(files):
    assert list(jsonio.iter_jsonl(files["good"])) == [(1, GOOD), (3, GOOD)]
    assert jsonio.read_jsonl(files["good"]) == [GOOD, GOOD]
    assert jsonio.read_jsonl(files["empty"]) == [] and jsonio.read_jsonl(files["blank"]) == []


@pytest.mark.parametrize("name, message", [
    ("bad", "{}:3: not valid JSON (Expecting value, column 15)"),
    ("binary", "{}: is a binary file, not UTF-8 JSON text"),
    ("latin1", "{}:2: not valid UTF-8 (byte 11)"),
])
def test_reader_errors_name_file_and_line(files, name, message):
    with pytest.raises(jsonio.DataFileError) as e:
        jsonio.read_jsonl(files[name])
    assert str(e.value) == message.format(files[name])
    assert isinstance(e.value, ConfigError) and e.value.path == files[name]


def test_read_json(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"a": [1,\n 2,,]}')
    with pytest.raises(jsonio.DataFileError) as e:
        jsonio.read_json(p)
    assert str(e.value) == f"{p}:2: not valid JSON (Expecting value, column 4)" and e.value.line == 2
    p.write_text('{"a": [1, 2]}')
    assert jsonio.read_json(p) == {"a": [1, 2]}
    with pytest.raises(jsonio.DataFileError, match=f"^{tmp_path}/nope.json: does not exist$"):
        jsonio.read_json(tmp_path / "nope.json")


class _CallerError(ValueError):
    pass


def test_readers_raise_the_callers_error_type(files, tmp_path):
    """`error=` swaps DataFileError for the caller's type, the location written as `located` writes it."""
    for read in (jsonio.read_jsonl, jsonio.read_jsonl_numbered, lambda p, **kw: list(jsonio.iter_jsonl(p, **kw))):
        with pytest.raises(_CallerError) as e:
            read(files["bad"], error=_CallerError)
        assert str(e.value) == f"{files['bad']}, line 3: not valid JSON (Expecting value, column 15)"
        assert not isinstance(e.value, jsonio.DataFileError)
    assert jsonio.read_jsonl_numbered(files["good"], error=_CallerError) == [(1, GOOD), (3, GOOD)]
    p = tmp_path / "x.json"
    p.write_text('{"a": [1,\n 2,,]}')
    with pytest.raises(_CallerError) as e:
        jsonio.read_json(p, error=_CallerError)
    assert str(e.value) == f"{p}, line 2: not valid JSON (Expecting value, column 4)"
    with pytest.raises(_CallerError) as e:
        jsonio.read_json(tmp_path / "nope.json", error=_CallerError)
    assert str(e.value) == f"{tmp_path}/nope.json: does not exist"


@pytest.mark.parametrize("name, message", [
    ("bad", "{}:3: not valid JSON (Expecting value, column 15)"),
    ("field", "{}:2: no 'messages' (or 'conversations') field; keys are ['msgs']"),
    ("array", "{}:2: expected a JSON object, got list"),
    ("empty", "{}: is empty (no JSON records)"),
    ("blank", "{}: holds only blank lines (no JSON records)"),
    ("binary", "{}: is a binary file, not UTF-8 JSON text"),
])
def test_check_data_files_names_the_first_problem(files, name, message):
    cfg = DataConfig(sources=(SourceConfig(files["good"], name="g"), SourceConfig(files[name], name="x")))
    with pytest.raises(jsonio.DataFileError) as e:
        check_data_files(cfg)
    assert str(e.value) == message.format(files[name])


def test_check_data_files_counts_and_formats(files, tmp_path):
    cfg = DataConfig(sources=(SourceConfig(files["good"]),))
    assert check_data_files(cfg) == {files["good"]: 2}
    tokens = _write(tmp_path / "t.jsonl", [{"tokens": [1, 2], "loss_mask": [0, 1]}, {"tokens": [1]}])
    with pytest.raises(jsonio.DataFileError) as e:
        check_data_files(DataConfig(sources=(SourceConfig(tokens, format="tokens"),)))
    assert str(e.value) == f"{tokens}:2: missing field 'loss_mask' (keys are ['tokens'])"
    tt = _write(tmp_path / "tt.jsonl", [{"messages": []}])
    with pytest.raises(jsonio.DataFileError, match=rf"^{tt}:1: "):
        check_data_files(DataConfig(sources=(SourceConfig(tt, format="thoughttrace"),)))


def test_skip_bad_records_counts_usable_records_and_refuses_a_file_of_none(files):
    skip = dict(skip_bad_records=True)
    assert check_data_files(DataConfig(sources=(SourceConfig(files["bad"]),), **skip)) == {files["bad"]: 3}
    with pytest.raises(jsonio.DataFileError, match="is empty"):
        check_data_files(DataConfig(sources=(SourceConfig(files["empty"]),), **skip))
    with pytest.raises(jsonio.DataFileError) as e:  # midtrain records read as ThoughtTrace: all of them bad
        check_data_files(DataConfig(sources=(SourceConfig(files["good"], format="thoughttrace"),), **skip))
    assert str(e.value).startswith(f"{files['good']}: none of its 2 records is usable (the first: line 1: ")


def test_parquet_files_are_checked(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    good, none, fake = tmp_path / "a.parquet", tmp_path / "b.parquet", tmp_path / "c.parquet"
    pq.write_table(pa.table({"messages": [json.dumps(GOOD)] * 3}), good)
    pq.write_table(pa.table({"messages": pa.array([], pa.string())}), none)
    fake.write_text('{"not": "parquet"}\n')
    assert check_data_files(DataConfig(sources=(SourceConfig(str(good)),))) == {str(good): 3}
    for path, reason in ((none, "holds no rows"), (fake, "is not a parquet file (no PAR1 magic bytes)")):
        with pytest.raises(jsonio.DataFileError) as e:
            check_data_files(DataConfig(sources=(SourceConfig(str(path)),)))
        assert str(e.value) == f"{path}: {reason}"


def test_the_pipeline_names_an_empty_or_binary_file(files):
    from mimesis_jax.data.pipeline import make_iterator
    from mimesis_jax.data.tokenizer import load_tokenizer

    for name, reason in (("empty", "is empty (no JSON records)"), ("binary", "is a binary file, not UTF-8 JSON text")):
        with pytest.raises(jsonio.DataFileError) as e:
            make_iterator(DataConfig(sources=(SourceConfig(files[name]),)), load_tokenizer("tiny"), batch_size=1,
                          seed=0)
        assert str(e.value) == f"{files[name]}: {reason}"


@pytest.mark.parametrize("stage, config, sample", [("midtrain", "tiny_midtrain.py", "midtrain_everyday.jsonl"),
                                                   ("sft", "tiny_sft.py", "thoughttrace_sample.jsonl")])
@pytest.mark.parametrize("name, message", [
    ("bad", "error: {}:3: not valid JSON (Expecting value, column 15)"),
    ("field", "error: {}:2: no 'messages' (or 'conversations') field; keys are ['msgs']"),
    ("empty", "error: {}: is empty (no JSON records)"),
    ("binary", "error: {}: is a binary file, not UTF-8 JSON text"),
])
def test_cli_names_the_bad_file_before_training(files, tmp_path, capsys, stage, config, sample, name, message):
    from mimesis_jax.cli import main
    from mimesis_jax.data.tokenizer import samples_dir

    good = jsonio.read_jsonl(os.path.join(samples_dir(), sample))[0]  # a record of the stage's format
    path = {"bad": lambda: _write(tmp_path / "bad.jsonl", [good, good, '{"messages": [oops', good]),
            "field": lambda: _write(tmp_path / "field.jsonl", [good, {"msgs": []}])}.get(name, lambda: files[name])()
    wd = tmp_path / f"wd_{stage}"
    rc = main([stage, "--config", os.path.join(REPO, "configs", config), "--workdir", str(wd), "--set",
               f"data.sources.0.path={path}", "data.skip_bad_records=false", "train.steps=2",
               "optimizer.warmup_steps=0"])
    out = capsys.readouterr()
    assert rc == 2 and out.err.strip().splitlines() == [message.format(path)]
    assert not os.path.exists(wd / "checkpoints") and not os.path.exists(wd / "metrics.jsonl")


def test_cli_refuses_a_file_with_no_usable_record(files, tmp_path, capsys):
    """tiny_sft skips bad records; midtrain records given to it are all bad (the pipeline would skip forever)."""
    from mimesis_jax.cli import main

    rc = main(["sft", "--config", os.path.join(REPO, "configs", "tiny_sft.py"), "--workdir", str(tmp_path / "wd"),
               "--set", f"data.sources.0.path={files['good']}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"error: {files['good']}: none of its 2 records is usable")


@pytest.mark.parametrize("name, reason", [
    ("tasks", "{}, row 1: not valid JSON (Expecting value, column 13)"),  # task files count rows from 0
    ("binary", "{}: is a binary file, not UTF-8 JSON text"),
])
def test_cli_agentrl_names_a_bad_task_file_before_any_model_work(files, tmp_path, capsys, name, reason):
    from mimesis_jax.cli import main

    files["tasks"] = _write(tmp_path / "tasks.jsonl", ["", '{"prompt": [oops'])
    wd = tmp_path / "wd"
    rc = main(["agentrl", "--config", os.path.join(REPO, "configs", "tiny_agentrl.py") + ":grpo", "--workdir", str(wd),
               "--set", f"gyms.sources=['{files[name]}']"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["error: config key 'gyms': " + reason.format(files[name])]
    assert not os.path.exists(wd / "run_config.json") and not os.path.exists(wd / "checkpoints")
