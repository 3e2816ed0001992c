"""Rooms a reader holds (issue #42 item 4): no function or method in mimesis_jax/ is longer than MAX_LINES lines
(from its `def` to its last line, nested functions counted in it), but the ones still to split, named in
STILL_TO_SPLIT. That list only shrinks: an entry that is no longer too long (or no longer exists) fails the test
until it is removed."""

from __future__ import annotations

import ast
import os

import mimesis_jax

ROOT = os.path.dirname(mimesis_jax.__file__)
MAX_LINES = 120

# "path under mimesis_jax/:qualified name", each in the hands of a #42 piece still open
STILL_TO_SPLIT: set[str] = set()


def function_lengths(source: str) -> dict[str, int]:
    """{qualified name: lines from `def` to the end} of every function in `source`, methods and nested ones
    included (named Outer.inner)."""
    out = {}

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    out[name] = child.end_lineno - child.lineno + 1
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return out


def package_lengths() -> dict[str, int]:
    out = {}
    for dirpath, _, files in os.walk(ROOT):
        for fn in sorted(files):
            if fn.endswith(".py"):
                path = os.path.join(dirpath, fn)
                rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
                with open(path) as f:
                    out.update({f"{rel}:{name}": n for name, n in function_lengths(f.read()).items()})
    return out


def test_lengths_are_read_from_def_to_last_line_with_qualified_names():
    src = "def f():\n    def g():\n        return 1\n    return g\n\n\nclass C:\n    async def m(self):\n        pass\n"
    assert function_lengths(src) == {"f": 4, "f.g": 2, "C.m": 2}


def test_no_function_over_the_limit_but_the_ones_still_to_split():
    lengths = package_lengths()
    too_long = {name: n for name, n in lengths.items() if n > MAX_LINES}
    new = sorted(f"{name} ({too_long[name]} lines)" for name in set(too_long) - STILL_TO_SPLIT)
    assert not new, f"functions over {MAX_LINES} lines: {new}; split them into steps a reader holds one at a time"
    done = sorted(STILL_TO_SPLIT - set(too_long))
    assert not done, f"no longer over {MAX_LINES} lines (or gone): {done}; remove them from STILL_TO_SPLIT"
