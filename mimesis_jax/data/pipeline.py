"""Grain input pipelines: local corpora -> examples -> weighted mixture -> packed rows -> batches.

    cfg = DataConfig(sources=(SourceConfig("data/a.jsonl", weight=3.0), SourceConfig("data/b.parquet")),
                     seq_len=2048)
    it = make_iterator(cfg, tok, batch_size=8, seed=0, process_index=jax.process_index(),
                       process_count=jax.process_count())
    batch = next(it)          # {"tokens", "positions", "segment_ids", "loss_mask"}: [8, 2048] numpy
    state = it.get_state()    # JSON-serialisable; it.set_state(state) resumes exactly
    it.stats                  # {"skipped_records": ..., "truncated_examples": ..., "batches": ..., ...}

Per source (one grain ``MapDataset`` each):
  records read with HF ``datasets`` (``.jsonl``/``.json`` lines via the "text" builder so every line keeps its
  index and a malformed line fails alone; ``.parquet``; ``.arrow``; a ``save_to_disk`` directory), several files
  per source by glob -> this host's shard ``[process_index::process_count]`` (hosts see disjoint records) -> a
  global shuffle, reseeded every epoch -> ``num_epochs`` repeats (None: forever) -> record -> example
  (``midtrain``, ``thoughttrace`` or pre-tokenized ``tokens`` records) -> an iterator (``read_threads`` > 0
  converts records on grain threads).
Then ``MixtureIterDataset`` picks the source of every example by weighted sampling (a seeded counter-based draw:
deterministic, and the proportions converge to the weights); the stream stops at the first exhausted source.
``packing.PackIterDataset`` packs examples into rows; ``BatchIterator`` stacks rows into batches (a final partial
batch is padded with empty rows unless ``drop_remainder``).

A record that cannot be converted raises ``RecordError`` naming the file and record index (line = index + 1 for
JSON lines). With ``skip_bad_records=True`` it is logged (``logging.warning`` with file and index) and counted in
``stats["skipped_records"]`` instead. Over-long examples follow ``overlong`` and are counted.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import logging
import math
import os
import zlib
from typing import Any, Literal

import grain
import numpy as np

from mimesis_jax.data import jsonio
from mimesis_jax.data.midtrain import RecordError, conversation_messages, last_user_index, midtrain_example
from mimesis_jax.data.packing import ROW_KEYS, PackIterDataset, fit_length
from mimesis_jax.data.thoughttrace import thoughttrace_example, thoughttrace_messages
from mimesis_jax.data.tokenizer import Tokenizer
from mimesis_jax.errors import ConfigError

log = logging.getLogger(__name__)

FORMATS = ("midtrain", "thoughttrace", "tokens")
STATE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class SourceConfig:
    path: str  # a file, a glob of files, or a HF save_to_disk directory
    weight: float = 1.0  # relative sampling weight in the mixture
    format: Literal["midtrain", "thoughttrace", "tokens"] = "midtrain"
    name: str = ""  # unique name (default: the file stem); keys the source's seed and its checkpoint state
    split: str = "train"  # the split of a save_to_disk DatasetDict


@dataclasses.dataclass(frozen=True)
class DataConfig:
    sources: tuple[SourceConfig, ...] = ()
    seq_len: int = 1024
    packing: bool = True  # several examples per row; False: one example per row
    pack_bins: int = 16  # rows packed at once (first fit within the window)
    shuffle: bool = True
    num_epochs: int | None = None  # passes over every source (None: repeat forever)
    skip_bad_records: bool = False  # False: a bad record is an error; True: logged and counted
    last_user_turn_only: bool = False  # midtrain: loss on the final user turn only
    persona: bool = True  # thoughttrace: system message from task_summary / task_expectation / survey_answers
    overlong: Literal["truncate", "skip", "error"] = "truncate"  # examples longer than seq_len
    read_threads: int = 0  # grain threads converting records per source (0: in the calling thread)
    drop_remainder: bool = False  # a final partial batch: dropped, or padded with empty rows
    cache_dir: str | None = None  # HF datasets cache (None: the HF default)

    def validate(self) -> None:
        def need(cond, key, msg):
            if not cond:
                raise ConfigError(f"config key 'data.{key}': {msg}")

        need(isinstance(self.sources, (tuple, list)) and len(self.sources) > 0, "sources",
             "needs at least one SourceConfig")
        names = []
        for i, s in enumerate(self.sources):
            need(isinstance(s, SourceConfig), f"sources.{i}", f"must be a SourceConfig, got {type(s).__name__}")
            need(isinstance(s.path, str) and s.path, f"sources.{i}.path", "must be a non-empty path")
            need(isinstance(s.weight, (int, float)) and math.isfinite(s.weight) and s.weight > 0,
                 f"sources.{i}.weight", f"must be a finite number > 0, got {s.weight!r}")
            need(s.format in FORMATS, f"sources.{i}.format", f"must be one of {FORMATS}, got {s.format!r}")
            names.append(source_name(s))
        dup = sorted({n for n in names if names.count(n) > 1})
        need(not dup, "sources", f"source names must be unique (set SourceConfig.name); repeated: {dup}")
        need(isinstance(self.seq_len, int) and self.seq_len >= 2, "seq_len", f"must be an int >= 2, got "
             f"{self.seq_len!r}")
        need(isinstance(self.pack_bins, int) and self.pack_bins >= 1, "pack_bins", f"must be >= 1, got "
             f"{self.pack_bins!r}")
        need(self.num_epochs is None or (isinstance(self.num_epochs, int) and self.num_epochs >= 1), "num_epochs",
             f"must be None (forever) or an int >= 1, got {self.num_epochs!r}")
        need(self.overlong in ("truncate", "skip", "error"), "overlong",
             f"must be 'truncate', 'skip' or 'error', got {self.overlong!r}")
        need(isinstance(self.read_threads, int) and self.read_threads >= 0, "read_threads", "must be >= 0")


def source_name(s: SourceConfig) -> str:
    if s.name:
        return s.name
    base = os.path.basename(s.path.rstrip("/"))
    return base.split(".")[0] or s.path


# ---------------------------------------------------------------------------------------------- reading
def _files(src: SourceConfig, key: str) -> list[str]:
    path = os.path.expanduser(src.path)
    if os.path.isdir(path):
        return [path]
    files = sorted(glob.glob(path)) if any(c in path for c in "*?[") else ([path] if os.path.isfile(path) else [])
    if not files:
        raise ConfigError(f"config key '{key}.path': no file or directory matches {src.path!r}")
    return files


def _load_file(path: str, src: SourceConfig, cache_dir: str | None):
    """(HF dataset, is_json_lines) for one file or save_to_disk directory."""
    # lazy (b): HF datasets is heavy; only for files grain cannot read
    import datasets

    datasets.disable_progress_bars()
    if os.path.isdir(path):
        ds = datasets.load_from_disk(path)
        if isinstance(ds, datasets.DatasetDict):
            if src.split not in ds:
                raise ConfigError(f"{path}: no split {src.split!r} (has {sorted(ds)})")
            ds = ds[src.split]
        return ds, False
    ext = path.rsplit(".", 1)[-1].lower() if "." in os.path.basename(path) else ""
    if ext in ("jsonl", "json", "ndjson"):
        ds = datasets.load_dataset("text", data_files=path, split="train", cache_dir=cache_dir,
                                   keep_linebreaks=False)
        return ds, True
    if ext == "parquet":
        return datasets.load_dataset("parquet", data_files=path, split="train", cache_dir=cache_dir), False
    if ext == "arrow":
        return datasets.Dataset.from_file(path), False
    raise ConfigError(f"{path}: unsupported file type {ext!r} (use .jsonl, .json lines, .parquet, .arrow or a "
                      "save_to_disk directory)")


def _json_lines_ext(path: str) -> bool:
    return os.path.isfile(path) and path.rsplit(".", 1)[-1].lower() in ("jsonl", "json", "ndjson")


def check_file(path: str) -> None:
    """File-level checks before `datasets` reads a file: a JSON-lines file exists, is not empty and is text; a
    parquet file starts and ends with its magic bytes and holds rows (`jsonio.DataFileError` otherwise)."""
    if os.path.isdir(path):
        return
    ext = path.rsplit(".", 1)[-1].lower() if "." in os.path.basename(path) else ""
    if ext in ("jsonl", "json", "ndjson"):
        jsonio.check_text_file(path)
    elif ext == "parquet":
        if not os.path.isfile(path):
            raise jsonio.DataFileError(path, None, "does not exist")
        size = os.path.getsize(path)
        if size == 0:
            raise jsonio.DataFileError(path, None, "is empty (no parquet records)")
        with open(path, "rb") as f:
            head = f.read(4)
            f.seek(max(0, size - 4))
            tail = f.read(4)
        if head != b"PAR1" or tail != b"PAR1":
            raise jsonio.DataFileError(path, None, "is not a parquet file (no PAR1 magic bytes)")
        # lazy (b): pyarrow only for .parquet files
        import pyarrow.parquet as pq

        try:
            rows = pq.read_metadata(path).num_rows
        except Exception as e:  # noqa: BLE001 -- any reader failure is the file's fault
            raise jsonio.DataFileError(path, None, f"is not a readable parquet file ({e})") from None
        if rows == 0:
            raise jsonio.DataFileError(path, None, "holds no rows")


def record_checker(fmt: str, cfg: "DataConfig"):
    """check(record, where) for one record of `fmt`: the structure the conversion needs (fields, roles, a user
    turn to learn), without tokenizing. Raises RecordError."""
    def midtrain(rec, where):
        last_user_index(conversation_messages(rec, where=where, keep=("tool_calls",)), where)

    def thoughttrace(rec, where):
        thoughttrace_messages(rec, where=where, persona=cfg.persona)

    def tokens(rec, where):
        jsonio.require_fields(rec, ("tokens", "loss_mask"), where)

    return {"midtrain": midtrain, "thoughttrace": thoughttrace, "tokens": tokens}[fmt]


def check_data_files(cfg: "DataConfig") -> dict[str, int]:
    """Reads every file of every source up front, before any training: the first problem raises
    `jsonio.DataFileError` naming the file (and line). JSON-lines files are read whole: each line must be a JSON
    object with the structure its source's format needs (with ``skip_bad_records`` bad lines are left to be
    skipped and counted, but a file with no usable record is an error: the pipeline would skip forever);
    parquet files are checked for their magic bytes and a row count. Returns {file: usable records}
    (parquet: its rows; a save_to_disk directory: not counted)."""
    cfg.validate()
    counts = {}
    for i, src in enumerate(cfg.sources):
        for path in _files(src, f"data.sources.{i}"):
            check_file(path)
            if _json_lines_ext(path):
                counts[path] = jsonio.check_jsonl(path, check=record_checker(src.format, cfg),
                                                  skip_bad=cfg.skip_bad_records)
            elif path.endswith(".parquet"):
                # lazy (b): pyarrow only for .parquet files
                import pyarrow.parquet as pq

                counts[path] = pq.read_metadata(path).num_rows
    return counts


class RecordSource:
    """Random access over the records of every file of a source: item i -> (file, index in file, raw record)."""

    def __init__(self, src: SourceConfig, key: str, cache_dir: str | None = None):
        files = _files(src, key)
        for f in files:
            check_file(f)  # an empty or binary file is named here, not deep inside `datasets`
        self.parts = [(f,) + _load_file(f, src, cache_dir) for f in files]
        self.offsets = np.cumsum([0] + [len(ds) for _, ds, _ in self.parts])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, i: int):
        i = int(i)
        p = int(np.searchsorted(self.offsets, i, side="right")) - 1
        f, ds, lines = self.parts[p]
        j = i - int(self.offsets[p])
        row = ds[j]
        return f, j, (row["text"] if lines else row), lines


class ConvertRecord:
    """Raw record -> example dict (or a skip marker); errors name the file and the record index."""

    def __init__(self, tok: Tokenizer, fmt: str, cfg: DataConfig):
        self.tok, self.fmt, self.cfg = tok, fmt, cfg

    def __call__(self, item) -> dict:
        path, index, raw, lines = item
        where = f"{path} record {index}" + (f" (line {index + 1})" if lines else "")
        try:
            ex = self._convert(raw, lines, where)
        except RecordError as e:
            if not self.cfg.skip_bad_records:
                raise
            log.warning("skipping bad record: %s", e)
            return {"_skip": True, "_stats": {"skipped_records": 1}}
        n = len(ex["tokens"])
        fitted = fit_length(ex, self.cfg.seq_len, self.cfg.overlong, where)
        if fitted is None:
            log.warning("skipping %s: %d tokens > seq_len %d", where, n, self.cfg.seq_len)
            return {"_skip": True, "_stats": {"overlong_skipped": 1}}
        stats = {"examples": 1, "truncated_examples": int(len(fitted["tokens"]) < n)}
        if not np.any(fitted["loss_mask"][1:]):
            log.warning("%s: no target token left within seq_len %d; dropped", where, self.cfg.seq_len)
            return {"_skip": True, "_stats": {"no_target_examples": 1}}
        return {"tokens": fitted["tokens"], "loss_mask": fitted["loss_mask"], "_stats": stats}

    def _convert(self, raw, lines: bool, where: str) -> dict:
        if lines:
            if not raw.strip():
                raise RecordError(f"{where}: empty line")
            try:
                rec = json.loads(raw)
            except json.JSONDecodeError as e:
                raise RecordError(f"{where}: invalid JSON: {e}") from None
        else:
            rec = raw
        if self.fmt == "midtrain":
            return midtrain_example(self.tok, rec, last_user_turn_only=self.cfg.last_user_turn_only, where=where)
        if self.fmt == "thoughttrace":
            return thoughttrace_example(self.tok, rec, where=where, persona=self.cfg.persona)
        return _tokens_example(rec, self.tok, where)


def _tokens_example(rec, tok: Tokenizer, where: str) -> dict:
    """A pre-tokenized record {"tokens": [...], "loss_mask": [...]} (e.g. written by another stage)."""
    if not isinstance(rec, dict) or "tokens" not in rec or "loss_mask" not in rec:
        raise RecordError(f"{where}: a 'tokens' record needs 'tokens' and 'loss_mask' lists")
    try:
        t = np.asarray(rec["tokens"], dtype=np.int64)
        m = np.asarray(rec["loss_mask"], dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise RecordError(f"{where}: tokens/loss_mask must be numeric lists: {e}") from None
    if t.ndim != 1 or t.shape != m.shape or len(t) == 0:
        raise RecordError(f"{where}: tokens and loss_mask must be non-empty 1-D lists of equal length "
                          f"(got {t.shape} and {m.shape})")
    if t.min() < 0 or t.max() >= tok.vocab_size:
        raise RecordError(f"{where}: token ids must be in [0, {tok.vocab_size})")
    if not np.isin(m, (0, 1)).all():
        raise RecordError(f"{where}: loss_mask must hold 0/1 values")
    return {"tokens": t.astype(np.int32), "loss_mask": m.astype(np.int32)}


def source_seed(seed: int, name: str) -> int:
    return (int(seed) * 1_000_003 + zlib.crc32(name.encode())) % (2**32)


def source_dataset(src: SourceConfig, i: int, cfg: DataConfig, tok: Tokenizer, seed: int, process_index: int,
                   process_count: int) -> grain.IterDataset:
    key = f"data.sources.{i}"
    records = RecordSource(src, key, cfg.cache_dir)
    if len(records) < process_count:
        raise ConfigError(f"config key '{key}.path': {len(records)} records cannot be split over {process_count} "
                          "processes (every host needs at least one)")
    ds = grain.MapDataset.source(records)[process_index::process_count]
    if cfg.shuffle:
        ds = ds.shuffle(seed=source_seed(seed, source_name(src)))
    ds = ds.repeat(cfg.num_epochs).map(ConvertRecord(tok, src.format, cfg))
    return ds.to_iter_dataset(grain.ReadOptions(num_threads=cfg.read_threads,
                                                prefetch_buffer_size=4 * cfg.read_threads))


# ------------------------------------------------------------------------------------------------ mixture
class MixtureIterDataset(grain.IterDataset):
    """Weighted sampling over sources: element t comes from source ``choice(seed, t)`` drawn with probabilities
    ``weights / sum(weights)`` from a counter-based generator (blocks of 4096 draws seeded by (seed, block)), so
    the stream is a pure function of the seed and the state is (t, every source's position)."""

    BLOCK = 4096

    def __init__(self, parents: list[grain.IterDataset], weights: list[float], seed: int, names: list[str]):
        super().__init__(parents)
        w = np.asarray(weights, dtype=np.float64)
        self.p = w / w.sum()
        self.seed, self.names = int(seed), list(names)

    def __iter__(self):
        return MixtureIterator([p.__iter__() for p in self._parents], self.p, self.seed, self.names)


class MixtureIterator(grain.DatasetIterator):
    def __init__(self, parents, p, seed, names):
        super().__init__(parents)
        self.p, self.seed, self.names = p, seed, names
        self.t = 0
        self.counts = [0] * len(parents)
        self._block: tuple[int, np.ndarray] | None = None

    def choice(self, t: int) -> int:
        b = t // MixtureIterDataset.BLOCK
        if self._block is None or self._block[0] != b:
            rng = np.random.default_rng([self.seed, b, 0x6D6978])
            self._block = (b, rng.choice(len(self.p), size=MixtureIterDataset.BLOCK, p=self.p))
        return int(self._block[1][t % MixtureIterDataset.BLOCK])

    def __next__(self):
        d = self.choice(self.t) if len(self.p) > 1 else 0
        el = next(self._parents[d])  # StopIteration of any source ends the mixture
        self.t += 1
        self.counts[d] += 1
        return el

    def get_state(self) -> dict:
        return {"t": self.t, "counts": list(self.counts),
                "sources": {n: p.get_state() for n, p in zip(self.names, self._parents)}}

    def set_state(self, state: dict) -> None:
        missing = sorted(set(self.names) - set(state["sources"]))
        if missing:
            raise ValueError(f"data state has no position for source(s) {missing}; saved sources are "
                             f"{sorted(state['sources'])}")
        self.t, self.counts = int(state["t"]), [int(c) for c in state["counts"]]
        for n, p in zip(self.names, self._parents):
            p.set_state(state["sources"][n])


# -------------------------------------------------------------------------------------------------- batches
class BatchIterator:
    """[batch_size, seq_len] numpy batches; get_state/set_state resume exactly; ``stats`` counts what was read."""

    def __init__(self, rows: grain.DatasetIterator, mixture: MixtureIterator, batch_size: int, seq_len: int,
                 pad_id: int, drop_remainder: bool, fingerprint: str):
        self._rows, self._mixture = rows, mixture
        self.batch_size, self.seq_len, self.pad_id = batch_size, seq_len, pad_id
        self.drop_remainder, self.fingerprint = drop_remainder, fingerprint
        self._counters = {"batches": 0, "rows": 0, "empty_rows": 0, "tokens": 0, "target_tokens": 0}
        self._row_stats: dict = {}
        self._done = False

    def __iter__(self):
        return self

    def _empty_row(self) -> dict:
        return {"tokens": np.full(self.seq_len, self.pad_id, np.int32), "positions": np.zeros(self.seq_len, np.int32),
                "segment_ids": np.zeros(self.seq_len, np.int32), "loss_mask": np.zeros(self.seq_len, np.float32)}

    def __next__(self) -> dict:
        if self._done:
            raise StopIteration
        rows = []
        while len(rows) < self.batch_size:
            try:
                rows.append(next(self._rows))
            except StopIteration:
                self._done = True
                break
        if not rows or (self._done and self.drop_remainder):
            raise StopIteration
        for r in rows:
            self._row_stats = r.get("_stats", self._row_stats)
        c = self._counters
        c["empty_rows"] += self.batch_size - len(rows)
        rows += [self._empty_row() for _ in range(self.batch_size - len(rows))]
        batch = {k: np.stack([r[k] for r in rows]) for k in ROW_KEYS}
        c["batches"] += 1
        c["rows"] += self.batch_size
        c["tokens"] += int((batch["segment_ids"] > 0).sum())
        c["target_tokens"] += int(batch["loss_mask"].sum())
        return batch

    @property
    def stats(self) -> dict:
        out = {"skipped_records": 0, "examples": 0, "truncated_examples": 0}
        out.update(self._row_stats)
        out.update(self._counters)
        cap = self._counters["rows"] * self.seq_len
        out["padding_fraction"] = 1.0 - self._counters["tokens"] / cap if cap else 0.0
        return out

    def source_counts(self) -> dict[str, int]:
        """Examples drawn from each source so far (including ones packed into rows not yet returned)."""
        return dict(zip(self._mixture.names, self._mixture.counts))

    def get_state(self) -> dict:
        return {"version": STATE_VERSION, "fingerprint": self.fingerprint, "rows": self._rows.get_state(),
                "counters": dict(self._counters), "row_stats": dict(self._row_stats), "done": self._done}

    def set_state(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"data iterator state: expected version {STATE_VERSION}, got "
                             f"{state.get('version') if isinstance(state, dict) else type(state).__name__}")
        if state["fingerprint"] != self.fingerprint:
            raise ValueError("data iterator state was saved with a different data configuration (sources, weights, "
                             "seq_len, packing, seed, batch size or host sharding); it cannot be resumed exactly")
        self._rows.set_state(state["rows"])
        self._counters = {k: int(v) for k, v in state["counters"].items()}
        self._row_stats = dict(state["row_stats"])
        self._done = bool(state["done"])


def _fingerprint(cfg: DataConfig, tok: Tokenizer, batch_size: int, seed: int, pi: int, pc: int) -> str:
    d = dataclasses.asdict(cfg)
    for k in ("read_threads", "cache_dir", "skip_bad_records"):  # do not change the stream
        d.pop(k)
    d.update(batch_size=batch_size, seed=seed, process_index=pi, process_count=pc, vocab=tok.vocab_size,
             tokenizer=getattr(tok, "name", ""))
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def make_iterator(cfg: DataConfig, tok: Tokenizer, *, batch_size: int, seed: int, process_index: int = 0,
                  process_count: int = 1) -> BatchIterator:
    """The batch iterator of this host (see the module docstring)."""
    cfg.validate()
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    if not 0 <= process_index < process_count:
        raise ConfigError(f"process_index {process_index} is not in [0, process_count={process_count})")
    sources = [source_dataset(s, i, cfg, tok, seed, process_index, process_count) for i, s in enumerate(cfg.sources)]
    names = [source_name(s) for s in cfg.sources]
    mixed = MixtureIterDataset(sources, [s.weight for s in cfg.sources], seed, names)
    packed = PackIterDataset(mixed, seq_len=cfg.seq_len, pad_id=tok.pad_id, num_bins=cfg.pack_bins,
                             packing=cfg.packing)
    rows = packed.__iter__()
    return BatchIterator(rows, rows.source, batch_size, cfg.seq_len, tok.pad_id, cfg.drop_remainder,
                         _fingerprint(cfg, tok, batch_size, seed, process_index, process_count))


def decode_row(tok: Tokenizer, batch: dict, row: int) -> list[dict[str, Any]]:
    """Debug view of one packed row: per segment its text and its target text."""
    out = []
    seg = batch["segment_ids"][row]
    for s in np.unique(seg[seg > 0]):
        sel = seg == s
        ids, m = batch["tokens"][row][sel], batch["loss_mask"][row][sel] > 0
        out.append({"segment": int(s), "text": tok.decode(ids), "targets": tok.decode(ids[m])})
    return out
