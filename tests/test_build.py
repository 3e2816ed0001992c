"""BUILD cannot rot: every module, test file and benchmark is covered by exactly one Bazel target, and every file a
target names exists. The BUILD file is Starlark, which parses as Python: we read its calls with `ast`."""

import ast
import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _targets():
    with open(os.path.join(ROOT, "BUILD")) as f:
        tree = ast.parse(f.read(), "BUILD")
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id.startswith("py_"):
            kw = {k.arg: k.value for k in node.keywords}
            name = ast.literal_eval(kw["name"])
            srcs = ast.literal_eval(kw["srcs"]) if "srcs" in kw else []
            deps = ast.literal_eval(kw["deps"]) if "deps" in kw else []
            out.append((node.func.id, name, srcs, deps))
    return out


def _files(pattern):
    return {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern), recursive=True)
            if "__pycache__" not in p}


def test_every_module_is_in_exactly_one_library():
    listed = [s for kind, _, srcs, _ in _targets() if kind == "py_library" for s in srcs]
    modules = _files("mimesis_jax/**/*.py")
    assert len(listed) == len(set(listed)), f"files listed twice: {sorted({s for s in listed if listed.count(s) > 1})}"
    missing = sorted(modules - set(listed))
    assert not missing, f"modules without a py_library target in BUILD: {missing}"


def test_every_test_file_has_its_own_py_test():
    tests = {srcs[0] for kind, _, srcs, _ in _targets() if kind == "py_test"}
    missing = sorted(_files("tests/test_*.py") - tests)
    assert not missing, f"test files without a py_test target in BUILD: {missing}"


def test_every_benchmark_has_a_binary():
    bins = {s for kind, _, srcs, _ in _targets() if kind == "py_binary" for s in srcs}
    missing = sorted(_files("benchmarks/*.py") - bins)
    assert not missing, f"benchmarks without a py_binary target in BUILD: {missing}"


def test_every_listed_file_exists_and_deps_resolve():
    targets = _targets()
    names = {name for _, name, _, _ in targets}
    for kind, name, srcs, deps in targets:
        for s in srcs:
            assert os.path.exists(os.path.join(ROOT, s)), f"BUILD target {name} lists missing file {s}"
        for d in deps:
            if d.startswith(":"):
                assert d[1:] in names, f"BUILD target {name} depends on unknown target {d}"
