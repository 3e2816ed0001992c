"""The one reader of JSON-lines and JSON data files; every error names the file (and the line).

    for line, rec in iter_jsonl("data/a.jsonl"):   # (1-based line number, decoded value), blank lines skipped
        ...
    rows = read_jsonl("data/a.jsonl")              # [value, ...]
    obj = read_json("tasks.json")                  # the decoded document
    check_jsonl("data/a.jsonl", check=fn)          # a whole file up front: fn(record, where) may raise

A problem raises `DataFileError` (a `ConfigError`: the CLI reports it in one line with exit status 2) with the
message ``PATH:LINE: reason`` for a line (``not valid JSON (...)``, ``not valid UTF-8``, ``expected a JSON
object``, ``missing field 'x'``) or ``PATH: reason`` for the file (``does not exist``, ``is empty``, ``is a
binary file``). Its `path`, `line` (None for the file) and `reason` attributes let a caller re-word it; a caller with its own
error type passes it as `error=` (``read_json(p, error=EnvError)``) and gets that type with the message
``PATH, line LINE: reason`` (`located`) instead.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Callable, Iterator

from mimesis_jax.errors import ConfigError

_SNIFF_BYTES = 8192


class DataFileError(ConfigError):
    """A data file that cannot be read as records: ``PATH:LINE: reason`` (or ``PATH: reason``)."""

    def __init__(self, path, line: int | None, reason: str):
        self.path, self.line, self.reason = str(path), line, reason
        super().__init__(f"{self.path}:{line}: {reason}" if line is not None else f"{self.path}: {reason}")


def check_text_file(path, *, allow_empty: bool = False) -> None:
    """The file exists, is a regular file, is not empty (unless `allow_empty`) and does not look binary (a NUL
    byte, many control bytes or mostly non-UTF-8 bytes in its first 8 KiB)."""
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
    if _looks_binary(head):
        raise DataFileError(p, None, "is a binary file, not UTF-8 JSON text")


_TEXT_CONTROLS = frozenset(b"\t\n\r\f\v\b")


def _looks_binary(head: bytes) -> bool:
    """A NUL byte, more than 10% control bytes, or (from the 16th byte) bytes of which more than a third are not
    UTF-8. Text in another encoding (Latin-1 ...) is left to the line-level UTF-8 error, which names the line."""
    if b"\x00" in head:
        return True
    controls = sum(1 for b in head if (b < 0x20 and b not in _TEXT_CONTROLS) or b == 0x7F)
    if controls > 0.1 * len(head):
        return True
    bad = len(head) - len(head.decode("utf-8", errors="ignore").encode("utf-8"))
    return len(head) >= 16 and bad > len(head) / 3


@contextlib.contextmanager
def _reworded(error: type[Exception] | None):
    """A `DataFileError` raised inside becomes `error(located(e))` (the caller's own error type), when given."""
    if error is None:
        yield
        return
    try:
        yield
    except DataFileError as e:
        raise error(located(e)) from None


def iter_jsonl(path, *, keep_errors: bool = False, error: type[Exception] | None = None
               ) -> Iterator[tuple[int, Any]]:
    """(line number from 1, decoded value) for every non-blank line of a JSON-lines file (an empty file has
    none; `check_jsonl` refuses it). A line that is not UTF-8 JSON raises `DataFileError` (or `error`, see the
    module docstring), or with `keep_errors` is yielded as (line, that DataFileError) and reading goes on."""
    with _reworded(error):
        yield from _iter_jsonl(path, keep_errors)


def _iter_jsonl(path, keep_errors: bool) -> Iterator[tuple[int, Any]]:
    check_text_file(path, allow_empty=True)
    p = os.fspath(path)
    with open(p, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                err = DataFileError(p, n, f"not valid UTF-8 (byte {e.start + 1})")
            else:
                if not text.strip():
                    continue
                try:
                    rec = json.loads(text)
                except json.JSONDecodeError as e:
                    err = DataFileError(p, n, f"not valid JSON ({e.msg}, column {e.colno})")
                else:
                    yield n, rec
                    continue
            if not keep_errors:
                raise err
            yield n, err


def read_jsonl(path, *, error: type[Exception] | None = None) -> list[Any]:
    """The decoded values of every non-blank line of a JSON-lines file."""
    return [rec for _, rec in iter_jsonl(path, error=error)]


def read_jsonl_numbered(path, *, error: type[Exception] | None = None) -> list[tuple[int, Any]]:
    """[(line number, decoded value), ...] of a JSON-lines file, read whole first (so a caller's own record
    errors never mix with the reader's)."""
    return list(iter_jsonl(path, error=error))


def read_json(path, *, error: type[Exception] | None = None) -> Any:
    """The decoded JSON document of a file (errors name the line of a syntax error)."""
    with _reworded(error):
        return _read_json(path)


def _read_json(path) -> Any:
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


def check_jsonl(path, *, check: Callable[[Any, str], None] | None = None, objects: bool = True,
                skip_bad: bool = False) -> int:
    """Reads a whole JSON-lines file up front; returns its number of usable records. Every line must be JSON (and
    a JSON object when `objects`); `check(record, where)` (``where`` = ``PATH:LINE``) may raise any ValueError,
    which becomes a `DataFileError` for that line. The first bad line raises, or with `skip_bad` is counted out
    (the reader skips it later). A file with no usable record is an error (naming the first bad line, if any)."""
    check_text_file(path)
    usable, first_bad, n_bad = 0, None, 0
    for n, rec in iter_jsonl(path, keep_errors=skip_bad):
        err = rec if isinstance(rec, DataFileError) else _record_problem(path, n, rec, check, objects)
        if err is None:
            usable += 1
            continue
        if not skip_bad:
            raise err
        n_bad += 1
        first_bad = first_bad or err
    if usable == 0:
        if first_bad is not None:
            raise DataFileError(path, None, f"none of its {n_bad} records is usable (the first: line "
                                            f"{first_bad.line}: {first_bad.reason})")
        raise DataFileError(path, None, "holds only blank lines (no JSON records)")
    return usable


def _record_problem(path, n: int, rec, check, objects: bool) -> DataFileError | None:
    if objects and not isinstance(rec, dict):
        return DataFileError(path, n, f"expected a JSON object, got {type(rec).__name__}")
    if check is not None:
        where = f"{os.fspath(path)}:{n}"
        try:
            check(rec, where)
        except DataFileError as e:
            return e
        except ValueError as e:
            msg = str(e)
            return DataFileError(path, n, msg[len(where) + 2:] if msg.startswith(where + ": ") else msg)
    return None


def require_fields(rec: dict, fields, where: str) -> None:
    """`rec` has every key of `fields` (a ValueError ``WHERE: missing field 'x'`` otherwise)."""
    for k in fields:
        if k not in rec:
            raise ValueError(f"{where}: missing field '{k}' (keys are {sorted(rec)[:12]})")


def located(e: DataFileError, style: str = "{path}, line {line}") -> str:
    """The message of `e` with its location written in a caller's own style (``{path}``, ``{line}``)."""
    loc = e.path if e.line is None else style.format(path=e.path, line=e.line)
    return f"{loc}: {e.reason}"
