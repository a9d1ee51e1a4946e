"""Issue 51 item 6: the docs' code runs.  Every ```python block of README.md and docs/*.md is executed here, on the
demo of README's command 1 (``vidcache demo`` + ``prewarm --cache demo/cache``), from the directory that holds it.

A block may carry one marker, an HTML comment on the line before its fence:
  ``<!-- docs-test: skip: WHY -->``       not run, and WHY (required) is the skip's reason: a GPU, a server, vLLM
  ``<!-- docs-test: after README.md -->`` run in the namespace README.md's block leaves (it continues from it)
"""
import json
import re
from pathlib import Path

import pytest

from support.cli import ROOT, run_cli

DOCS = [Path(ROOT) / "README.md", *sorted((Path(ROOT) / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_MARK = re.compile(r"<!-- docs-test: (skip|after)(?::? (.*?))? -->")


def blocks(path: Path) -> list[tuple[int, str, tuple]]:
    """(line, code, marker) of each python block of ``path``; marker: () or (kind, argument)."""
    text = path.read_text()
    out = []
    for m in _BLOCK.finditer(text):
        before = text[:m.start()].rstrip("\n").splitlines()
        mark = _MARK.fullmatch(before[-1].strip()) if before else None
        out.append((text[:m.start()].count("\n") + 2, m.group(1), mark.groups() if mark else ()))
    return out


CASES = [(p, line, code, mark) for p in DOCS for line, code, mark in blocks(p)]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """README's command 1, less the install: the demo dataset prewarmed into demo/cache; ``train.jsonl`` its rows
    in the ``videos`` form, with absolute paths (docs/api.md's prewarm reads it)."""
    root = tmp_path_factory.mktemp("docs")
    run_cli(["demo", "--dir", "demo"], cwd=root, pythonpath=[], check=True, timeout=600)
    run_cli(["prewarm", "demo/dataset.jsonl", "--cache", "demo/cache", "--workers", "2", "--no-progress"],
            cwd=root, pythonpath=[], check=True, timeout=900)
    rows = [r for r in map(json.loads, (root / "demo" / "dataset.jsonl").read_text().splitlines()) if "videos" in r]
    for r in rows:
        r["videos"] = [str((root / "demo" / v).resolve()) for v in r["videos"]]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def _run(code: str, where: str, ns: dict) -> dict:
    exec(compile(code, where, "exec"), ns)       # noqa: S102  the repository's own documentation
    return ns


@pytest.mark.parametrize("path,line,code,mark", CASES, ids=[f"{p.name}:{ln}" for p, ln, _, _ in CASES])
def test_doc_block_runs(path, line, code, mark, demo, monkeypatch):
    if mark and mark[0] == "skip":
        assert mark[1] and len(mark[1]) > 10, f"{path.name}:{line}: a skipped block must say why"
        pytest.skip(f"{path.name}:{line}: {mark[1]}")
    monkeypatch.chdir(demo)
    for var in ("VIDCACHE_DIR", "VIDCACHE_SHARED"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("VIDCACHE_DIR", str(demo / "node"))      # the default cache of a block that names none
    ns = {"__name__": "__docs__"}
    if mark and mark[0] == "after":
        (prev_line, prev, _), = [b for b in blocks(Path(ROOT) / mark[1])]
        _run(prev, f"{mark[1]}:{prev_line}", ns)
    _run(code, f"{path.name}:{line}", ns)


def test_every_marker_is_understood():
    """A misspelt marker would silently run (or silently not skip) its block."""
    for p in DOCS:
        for n, ln in enumerate(p.read_text().splitlines(), 1):
            if "docs-test" in ln:
                m = _MARK.fullmatch(ln.strip())
                assert m and (m[1] != "after" or (Path(ROOT) / m[2]).is_file()), f"{p.name}:{n}: {ln}"


def test_the_tier_object_the_docs_name_is_where_the_store_keeps_it(tmp_path):
    """docs and errors name meta/c1/tier (keys.TIER_OBJECT): the file a directory tier really holds."""
    from vidcache import VideoCache
    from vidcache.keys import TIER_OBJECT
    VideoCache(tmp_path / "node", shared=str(tmp_path / "tier"))
    assert [str(p.relative_to(tmp_path / "tier")) for p in (tmp_path / "tier" / "meta").rglob("*") if p.is_file()] \
        == [TIER_OBJECT]
    docs = " ".join(p.read_text() for p in DOCS)
    assert "`meta/tier`" not in docs and TIER_OBJECT in docs
