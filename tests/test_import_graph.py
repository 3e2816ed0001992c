"""Imports inside the package run one way: no circle among mimesis_jax modules (issue #15 item 5), and the
layers below the training code stay below it (issue #42 item 1): config/ imports only itself, models/config.py and
errors.py; algorithms/ (the maths) imports no model I/O (rollout/) and nothing that runs episodes or training.

The graph is read with `ast` from every module's import statements, the ones inside functions included (a
function-local import is still a dependency, only a deferred one). An import of `a.b.c` is an arrow to the module
`a.b.c` (a `from a.b import c` arrow goes to the submodule `a.b.c` when there is one, else to `a.b`); the package
__init__ that Python runs on the way is not counted. Imports by computed name (`importlib.import_module(name)`,
`__import__`) would not be seen, so the package has none (issue #42 item 4: go-to-definition reaches every module).
"""

from __future__ import annotations

import ast
import functools
import os

import mimesis_jax

ROOT = os.path.dirname(mimesis_jax.__file__)


def _modules(root: str = ROOT, package: str = "mimesis_jax") -> dict[str, str]:
    """{dotted module name: file path} of every .py file under the package."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for fn in files:
            if fn.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, fn), root)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                out[".".join([package] + rel)] = os.path.join(dirpath, fn)
    return out


def import_graph(modules: dict[str, str]) -> dict[str, set[str]]:
    """{module: modules of the package it imports, anywhere in its source}."""
    graph = {}
    for mod, path in modules.items():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        package = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    if sub in modules:
                        deps.add(sub)
                    elif base in modules:
                        deps.add(base)
        deps.discard(mod)
        graph[mod] = deps
    return graph


@functools.lru_cache(maxsize=1)
def package_graph() -> dict[str, set[str]]:
    """The package's graph, read once per test session (the tests below only read it)."""
    return import_graph(_modules())


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative), each sorted."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_circle_finder_on_known_graphs():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d", "f"}, "f": {"e"}}
    assert sorted(circles(g)) == [["a", "b", "c"], ["e", "f"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_graph_sees_top_level_relative_and_function_local_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.sub import leaf\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "leaf.py").write_text("from .. import top\n")
    (pkg / "top.py").write_text("def f():\n    import pkg.sub.leaf\n")
    g = import_graph(_modules(str(pkg), "pkg"))
    assert g == {"pkg": {"pkg.sub.leaf"}, "pkg.sub": set(), "pkg.sub.leaf": {"pkg.top"}, "pkg.top": {"pkg.sub.leaf"}}
    assert circles(g) == [["pkg.sub.leaf", "pkg.top"]]


def test_package_imports_have_no_circle():
    graph = package_graph()
    # the reader sees this package's arrows, function-local ones included (so an empty answer means something)
    assert "mimesis_jax.sharding" in graph["mimesis_jax.models"]
    assert "mimesis_jax.models.hf" in graph["mimesis_jax.models"]
    assert "mimesis_jax.sharding" in graph["mimesis_jax.models.layers"]  # an import inside embed_lookup
    assert "mimesis_jax.models.qwen3_5_paged" in graph["mimesis_jax.models"]  # models.family's, inside the function
    found = circles(graph)
    detail = [[f"{a} -> {b}" for a in c for b in sorted(graph[a]) if b in c] for c in found]
    assert not found, f"import circles among mimesis_jax modules: {detail}"


def arrows_out_of(graph: dict[str, set[str]], package: str, allowed=(), banned=()) -> list[str]:
    """The arrows from modules of `package` (itself included) that leave it for a module not under one of `allowed`
    (when given) or under one of `banned`, as "a -> b"."""
    def under(mod, roots):
        return any(mod == r or mod.startswith(r + ".") for r in roots)

    out = []
    for mod in sorted(m for m in graph if under(m, (package,))):
        for dep in sorted(graph[mod]):
            if under(dep, (package,)):
                continue
            if (allowed and not under(dep, allowed)) or under(dep, banned):
                out.append(f"{mod} -> {dep}")
    return out


def test_layer_rule_finder_on_a_known_graph():
    g = {"p.cfg": {"p.cfg.a", "p.models.config"}, "p.cfg.a": {"p.algos.x"}, "p.algos.x": {"p.io", "p.models"},
         "p.io": set(), "p.models": set(), "p.models.config": set()}
    assert arrows_out_of(g, "p.cfg", allowed=("p.models.config",)) == ["p.cfg.a -> p.algos.x"]
    assert arrows_out_of(g, "p.algos", banned=("p.io",)) == ["p.algos.x -> p.io"]
    assert arrows_out_of(g, "p.algos", banned=("p.i",)) == []  # a prefix of a name is not its package


CONFIG_MAY_IMPORT = ("mimesis_jax.models.config", "mimesis_jax.errors")
ALGORITHMS_MAY_NOT_IMPORT = ("mimesis_jax.inference", "mimesis_jax.chat", "mimesis_jax.serve", "mimesis_jax.envs", "mimesis_jax.episodes", "mimesis_jax.train",
                             "mimesis_jax.eval", "mimesis_jax.plan", "mimesis_jax.commands", "mimesis_jax.cli")


def test_config_and_algorithms_sit_below_the_code_that_runs_them():
    graph = package_graph()
    # the arrows these rules read are seen: config's own and the ones algorithms/ has into config/ and data/
    assert "mimesis_jax.models.config" in graph["mimesis_jax.config.sections"]
    assert "mimesis_jax.config.choices" in graph["mimesis_jax.algorithms.grpo"]
    assert "mimesis_jax.data.trajectory" in graph["mimesis_jax.algorithms.coach"]
    bad = arrows_out_of(graph, "mimesis_jax.config", allowed=CONFIG_MAY_IMPORT)
    assert not bad, f"config/ may import only {CONFIG_MAY_IMPORT} outside itself: {bad}"
    bad = arrows_out_of(graph, "mimesis_jax.algorithms", banned=ALGORITHMS_MAY_NOT_IMPORT)
    assert not bad, f"algorithms/ may import none of {ALGORITHMS_MAY_NOT_IMPORT}: {bad}"


def test_command_modules_sit_on_top():
    graph = package_graph()
    assert "mimesis_jax.commands.serve" in graph["mimesis_jax.cli"]  # the command table's arrows are seen
    inward = [f"{m} -> {d}" for m in sorted(graph) for d in sorted(graph[m])
              if d.startswith("mimesis_jax.commands") and not m.startswith(("mimesis_jax.commands", "mimesis_jax.cli"))]
    assert not inward, f"only cli.py and commands/ may import commands/ (docs/package-map.md): {inward}"


def computed_imports(modules: dict[str, str]) -> list[str]:
    """'module:line' of every call of importlib.import_module or __import__ (a module imported by a computed name)."""
    out = []
    for mod, path in sorted(modules.items()):
        with open(path) as f:
            source = f.read()
        if "import_module(" not in source and "__import__(" not in source:
            continue  # the common case, without a parse
        for node in ast.walk(ast.parse(source, path)):
            if isinstance(node, ast.Call):
                fn = node.func
                name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
                if name in ("import_module", "__import__"):
                    out.append(f"{mod}:{node.lineno}")
    return out


def test_no_module_is_imported_by_a_computed_name(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import importlib\n\ndef f(m):\n    return importlib.import_module(f'pkg.{m}')\n")
    (pkg / "b.py").write_text("import importlib.util\nspec = importlib.util.spec_from_file_location('c', 'c.py')\n")
    assert computed_imports(_modules(str(pkg), "pkg")) == ["pkg:4"]
    assert computed_imports(_modules()) == []
