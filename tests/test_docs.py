"""Docs hold together: every doc path cited in code or docs exists, every relative Markdown link (and its
#anchor) in README.md and docs/ resolves, section citations of docs/reference/paper.md name real sections, no
citation points outside the repository, every other Markdown file named in the package's code opens in the repository
or is one the package writes, and .ci/run runs exactly the README's test command. Pure Python."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCANNED = ("mimesis_jax", "configs", "tests", "benchmarks", "experiments", "scripts", "launch", "docs")
TEXT_SUFFIXES = {".py", ".md", ".toml", ".sh", ".txt", ".json", ".cfg", ".yaml", ".yml"}

# A repository path to a doc, as code and docs cite it: docs/<...>.md
DOC_PATH = re.compile(r"(?<![\w./-])(docs/[\w./-]*\w\.md)")
# A citation of a reference file that does not go through docs/reference/ (a file outside the repository).
_REF = "|".join(("paper", "environments", "metrics"))
BARE_REF = re.compile(r"(?<![\w/.-])(?:shared/reference/)?(?:" + _REF + r")\.md|shared/reference/")
PAPER_SECTION = re.compile(r"docs/reference/paper\.md,?\s+§?(\d+(?:\.\d+)?)\b")
# Any Markdown file named in the package's code (docs/ paths are DOC_PATH's; bare names, e.g. `report.md`)
MD_NAME = re.compile(r"(?<![\w./-])([\w./-]*\w\.md)\b")
# A quoted .md name in a module: a file the code writes or reads by that name
MD_LITERAL = re.compile(r"[\"']([\w./-]*\w\.md)[\"']")
MD_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def text_files(root: pathlib.Path):
    """README.md plus every text file under the scanned folders (this test module excluded: it names the
    patterns it looks for)."""
    files = [root / "README.md"]
    for top in SCANNED:
        base = root / top
        if base.is_dir():
            files += [p for p in sorted(base.rglob("*")) if p.is_file() and p.suffix in TEXT_SUFFIXES]
    return [p for p in files if p.exists() and p.resolve() != pathlib.Path(__file__).resolve()]


def read(p: pathlib.Path) -> str:
    return p.read_text(encoding="utf-8", errors="replace")


def missing_doc_citations(root: pathlib.Path) -> list[str]:
    """'file:line: docs/x.md' for every cited docs/ path that is not a file in the repository."""
    out = []
    for p in text_files(root):
        for n, line in enumerate(read(p).splitlines(), 1):
            for m in DOC_PATH.finditer(line):
                if not (root / m.group(1)).is_file():
                    out.append(f"{p.relative_to(root)}:{n}: {m.group(1)}")
    return out


def bare_reference_citations(root: pathlib.Path) -> list[str]:
    """Citations of paper/environments/metrics.md that do not name docs/reference/ (outside docs/, where
    relative Markdown links are checked by link resolution instead)."""
    out = []
    for p in text_files(root):
        rel = p.relative_to(root)
        if rel.parts[0] == "docs":
            continue
        for n, line in enumerate(read(p).splitlines(), 1):
            cleaned = line.replace("docs/reference/", "ok_")
            if BARE_REF.search(cleaned):
                out.append(f"{rel}:{n}: {line.strip()[:100]}")
    return out


def unopenable_md_names(root: pathlib.Path) -> list[str]:
    """'file:line: name.md' for every Markdown file named under mimesis_jax/ (outside docs/ paths) that is neither
    a file of the repository (a path from the root or the citing file's folder, or the name of a .md file under
    docs/ or mimesis_jax/) nor a name the package's code quotes (an output it writes, e.g. "report.md")."""
    package = [p for p in text_files(root) if p.relative_to(root).parts[0] == "mimesis_jax"]
    shipped = {p.name for top in ("docs", "mimesis_jax") for p in (root / top).rglob("*.md")}
    quoted = {pathlib.PurePath(m).name for p in package if p.suffix == ".py" for m in MD_LITERAL.findall(read(p))}
    out = []
    for p in package:
        for n, line in enumerate(read(p).splitlines(), 1):
            for m in MD_NAME.finditer(line):
                name = m.group(1)
                if name.startswith("docs/") or (root / name).is_file() or (p.parent / name).is_file():
                    continue
                if pathlib.PurePath(name).name not in shipped | quoted:
                    out.append(f"{p.relative_to(root)}:{n}: {name}")
    return out


def slug(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped (not - or _), spaces to hyphens."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(md: pathlib.Path) -> set[str]:
    found, seen = set(), {}
    in_code = False
    for line in read(md).splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code:
            continue
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            base = slug(m.group(1))
            k = seen.get(base, 0)
            found.add(base if k == 0 else f"{base}-{k}")
            seen[base] = k + 1
    return found


def broken_links(root: pathlib.Path) -> list[str]:
    """'file: target (why)' for every relative link in README.md and docs/*.md that does not resolve."""
    pages = [root / "README.md"] + sorted((root / "docs").rglob("*.md"))
    out = []
    for page in pages:
        if not page.exists():
            continue
        text = re.sub(r"```.*?```", "", read(page), flags=re.S)
        for target in MD_LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            rel = page.relative_to(root)
            if not dest.exists():
                out.append(f"{rel}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                out.append(f"{rel}: {target} (no heading #{anchor})")
    return out


def bad_paper_sections(root: pathlib.Path) -> list[str]:
    """Citations 'docs/reference/paper.md §N[.M]' whose section N[.M] is not a heading of paper.md."""
    paper = root / "docs" / "reference" / "paper.md"
    if not paper.is_file():
        return ["docs/reference/paper.md missing"]
    numbers = set(re.findall(r"^#{2,3}\s+(\d+(?:\.\d+)?)\.?\s", read(paper), flags=re.M))
    out = []
    for p in text_files(root):
        for n, line in enumerate(read(p).splitlines(), 1):
            for m in PAPER_SECTION.finditer(line):
                if m.group(1) not in numbers:
                    out.append(f"{p.relative_to(root)}:{n}: §{m.group(1)}")
    return out


def test_every_cited_doc_path_exists():
    assert missing_doc_citations(ROOT) == []


def test_every_markdown_file_the_package_names_opens():
    assert unopenable_md_names(ROOT) == []


def test_no_citation_points_outside_the_repository():
    assert bare_reference_citations(ROOT) == []


def test_readme_and_docs_links_resolve():
    assert broken_links(ROOT) == []


def test_paper_section_citations_name_real_sections():
    assert bad_paper_sections(ROOT) == []


def test_reference_pages_number_the_papers_equations():
    paper = read(ROOT / "docs" / "reference" / "paper.md")
    for eq in range(1, 14):  # Eq (1)-(13) live in paper.md; (14)-(16) in metrics.md
        assert f"Eq ({eq})" in paper or f"Eq ({eq})-" in paper, eq
    metrics = read(ROOT / "docs" / "reference" / "metrics.md")
    for eq in (14, 15, 16):
        assert f"Eq {eq}" in metrics or f"Eq ({eq})" in metrics, eq


def test_ci_runs_exactly_the_readme_test_command():
    readme = read(ROOT / "README.md")
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    test_cmds = [b.strip() for b in blocks if "pytest" in b]
    assert len(test_cmds) == 1, test_cmds
    ci = [ln for ln in read(ROOT / ".ci" / "run").splitlines() if ln.strip() and not ln.startswith(("#", "set ", "cd "))]
    assert ci == [test_cmds[0]]


def test_readme_is_a_landing_page():
    lines = read(ROOT / "README.md").splitlines()
    assert len(lines) <= 180, len(lines)


# The checks can fail: a tree with a cited missing doc, a bare citation, a dead link and a bad anchor.
def _tree(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "docs" / "reference").mkdir(parents=True)
    (tmp_path / "docs" / "reference" / "paper.md").write_text("# P\n\n## 4. Stage II\n\n### 4.1 GRPO\n")
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Real heading\n")
    (tmp_path / "mimesis_jax").mkdir()
    return tmp_path


def test_checks_pass_on_a_consistent_tree(tmp_path):
    root = _tree(tmp_path)
    (root / "README.md").write_text("[a](docs/a.md#real-heading) [p](docs/reference/paper.md)\n")
    (root / "mimesis_jax" / "m.py").write_text('"""GRPO (docs/reference/paper.md §4.1; docs/a.md)."""\n')
    assert missing_doc_citations(root) == []
    assert bare_reference_citations(root) == []
    assert broken_links(root) == []
    assert bad_paper_sections(root) == []


def test_checks_fail_on_missing_paths_links_and_sections(tmp_path):
    root = _tree(tmp_path)
    (root / "README.md").write_text("[gone](docs/gone.md) [bad anchor](docs/a.md#no-such) [ok](docs/a.md)\n")
    (root / "mimesis_jax" / "m.py").write_text(
        '"""See docs/reference/missing.md and paper.md 3.3 and shared/reference/metrics.md;\n'
        'docs/reference/paper.md §4.7 does not exist."""\n'
    )
    assert sorted(missing_doc_citations(root)) == ["README.md:1: docs/gone.md",
                                                   "mimesis_jax/m.py:1: docs/reference/missing.md"]
    assert [s.split(":")[0] for s in bare_reference_citations(root)] == ["mimesis_jax/m.py"]
    assert sorted(broken_links(root)) == ["README.md: docs/a.md#no-such (no heading #no-such)",
                                          "README.md: docs/gone.md (no such file)"]
    assert bad_paper_sections(root) == ["mimesis_jax/m.py:2: §4.7"]


def test_md_name_check_tells_a_missing_doc_from_a_shipped_file_or_an_output(tmp_path):
    root = _tree(tmp_path)
    (root / "mimesis_jax" / "data").mkdir()
    (root / "mimesis_jax" / "data" / "policy.md").write_text("# policy\n")
    (root / "mimesis_jax" / "m.py").write_text(
        '"""Format in eval_common.md; the policy in data/policy.md and policy.md;\n'
        'docs/a.md, a.md; writes OUT/report.md."""\n'
        'open("report.md", "w")\n')
    assert unopenable_md_names(root) == ["mimesis_jax/m.py:1: eval_common.md"]


@pytest.mark.parametrize("heading,expected", [
    ("3.4 Realistic behaviours on ABCD (Section 4.3, Appendix A.2, A.4)", "34-realistic-behaviours-on-abcd-section-43-appendix-a2-a4"),
    ("Will it fit? `plan`", "will-it-fit-plan"),
    ("I.3 joint RL: one simulator over the 24 domains", "i3-joint-rl-one-simulator-over-the-24-domains"),
])
def test_slug_matches_github(heading, expected):
    assert slug(heading) == expected
