"""The one reader of JSON-lines and JSON data files; every error names the file (and the line).

    for line, rec in iter_jsonl("data/a.jsonl"):   # (1-based line number, decoded value), blank lines skipped
        ...
    rows = read_jsonl("data/a.jsonl")              # [value, ...]
    obj = read_json("tasks.json")                  # the decoded document
    check_jsonl("data/a.jsonl", check=fn)          # a whole file up front: fn(record, where) may raise

A problem raises `DataFileError` (a `ConfigError`: the CLI reports it in one line with exit status 2) with the
message ``PATH:LINE: reason`` for a line (``not valid JSON (...)``, ``not valid UTF-8``, ``expected a JSON
object``, ``missing field 'x'``) or ``PATH: reason`` for the file (``does not exist``, ``is empty``, ``is a
binary file``). Its `path`, `line` (None for the file) and `reason` attributes let a caller re-word it.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Iterator

from mimesis_jax.models.config import ConfigError

_SNIFF_BYTES = 8192


class DataFileError(ConfigError):
    """A data file that cannot be read as records: ``PATH:LINE: reason`` (or ``PATH: reason``)."""

    def __init__(self, path, line: int | None, reason: str):
        self.path, self.line, self.reason = str(path), line, reason
        super().__init__(f"{self.path}:{line}: {reason}" if line is not None else f"{self.path}: {reason}")


def check_text_file(path, *, allow_empty: bool = False) -> None:
    """The file exists, is a regular file, is not empty (unless `allow_empty`) and does not look binary (a NUL
    byte, or bytes that are not UTF-8, in its first 8 KiB)."""
    p = os.fspath(path)
    if not os.path.exists(p):
        raise DataFileError(p, None, "does not exist")
    if not os.path.isfile(p):
        raise DataFileError(p, None, "is not a regular file")
    try:
        with open(p, "rb") as f:
            head = f.read(_SNIFF_BYTES)
    except OSError as e:
        raise DataFileError(p, None, f"cannot be read ({e.strerror or e})") from None
    if not head:
        if allow_empty:
            return
        raise DataFileError(p, None, "is empty (no JSON records)")
    if b"\x00" in head or _not_utf8(head):
        raise DataFileError(p, None, "is a binary file, not UTF-8 JSON text")


def _not_utf8(head: bytes) -> bool:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        # a multi-byte character cut by the sniff window is fine
        return not (e.start >= len(head) - 3 and e.reason == "unexpected end of data")
    return False


def iter_jsonl(path) -> Iterator[tuple[int, Any]]:
    """(line number from 1, decoded value) for every non-blank line of a JSON-lines file (an empty file has
    none; `check_jsonl` refuses it)."""
    check_text_file(path, allow_empty=True)
    p = os.fspath(path)
    with open(p, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataFileError(p, n, f"not valid UTF-8 (byte {e.start + 1})") from None
            if not text.strip():
                continue
            try:
                yield n, json.loads(text)
            except json.JSONDecodeError as e:
                raise DataFileError(p, n, f"not valid JSON ({e.msg}, column {e.colno})") from None


def read_jsonl(path) -> list[Any]:
    """The decoded values of every non-blank line of a JSON-lines file."""
    return [rec for _, rec in iter_jsonl(path)]


def read_json(path) -> Any:
    """The decoded JSON document of a file (errors name the line of a syntax error)."""
    check_text_file(path)
    p = os.fspath(path)
    try:
        with open(p, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise DataFileError(p, None, f"not valid UTF-8 (byte {e.start + 1})") from None
    if not text.strip():
        raise DataFileError(p, None, "is empty (no JSON document)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DataFileError(p, e.lineno, f"not valid JSON ({e.msg}, column {e.colno})") from None


def check_jsonl(path, *, check: Callable[[Any, str], None] | None = None, objects: bool = True) -> int:
    """Reads a whole JSON-lines file up front; returns its number of records. Every line must be JSON (and a JSON
    object when `objects`); `check(record, where)` (``where`` = ``PATH:LINE``) may raise any ValueError, which
    becomes a `DataFileError` for that line. A file with no record is an error."""
    check_text_file(path)
    n_records = 0
    for n, rec in iter_jsonl(path):
        if objects and not isinstance(rec, dict):
            raise DataFileError(path, n, f"expected a JSON object, got {type(rec).__name__}")
        if check is not None:
            where = f"{os.fspath(path)}:{n}"
            try:
                check(rec, where)
            except DataFileError:
                raise
            except ValueError as e:
                msg = str(e)
                reason = msg[len(where) + 2:] if msg.startswith(where + ": ") else msg
                raise DataFileError(path, n, reason) from None
        n_records += 1
    if n_records == 0:
        raise DataFileError(path, None, "holds only blank lines (no JSON records)")
    return n_records


def require_fields(rec: dict, fields, where: str) -> None:
    """`rec` has every key of `fields` (a ValueError ``WHERE: missing field 'x'`` otherwise)."""
    for k in fields:
        if k not in rec:
            raise ValueError(f"{where}: missing field '{k}' (keys are {sorted(rec)[:12]})")
