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


def _imported_files(path):
    """Project modules a file imports (ignoring `if TYPE_CHECKING:` blocks, which are annotations only)."""
    import re

    with open(os.path.join(ROOT, path)) as f:
        src = f.read()
    src = re.sub(r"if TYPE_CHECKING:[^\n]*\n((    [^\n]*)?\n)+", "\n", src)
    out = set()
    pat = r"^\s*(?:from|import)\s+(mimesis_jax(?:\.\w+)*)(?:\s+import\s+\(?([\w, ]+))?"
    for m in re.finditer(pat, src, re.M):
        mod, names = m.group(1), m.group(2)
        for cand in [mod] + ([f"{mod}.{n.strip()}" for n in names.split(",") if n.strip()] if names else []):
            base = cand.replace(".", "/")
            for fn in (base + ".py", base + "/__init__.py"):
                if os.path.exists(os.path.join(ROOT, fn)) and fn != path:
                    out.add(fn)
    return out


def test_library_deps_cover_imports():
    libs = [(name, srcs, deps) for kind, name, srcs, deps in _targets() if kind == "py_library"]
    owner = {s: name for name, srcs, _ in libs for s in srcs}
    for name, srcs, deps in libs:
        for s in srcs:
            for imported in _imported_files(s):
                target = owner.get(imported)
                assert target is not None, f"{s} imports {imported}, which no py_library lists"
                assert target == name or f":{target}" in deps, \
                    f"BUILD: {name} ({s}) imports {imported} from :{target} but does not depend on it"
