#!/usr/bin/env python3
"""Regenerate the launch settings in docs/*.md from `vidcache sglang-config` (the one source of them).

A generated block is a fenced code block right after a marker line naming the command's arguments:

    <!-- generated: vidcache sglang-config --family qwen2_5_vl --mode stock --sglang-version 0.5.16 --format miles -->
    ```bash
    ...the command's output...
    ```

    python scripts/gen_launch_docs.py            # rewrite the blocks of docs/miles.md
    python scripts/gen_launch_docs.py --check    # exit 1 when a block differs from the command (tests/test_examples.py)
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- generated: vidcache (?P<argv>[^\n]*?) -->\n```bash\n)(?P<body>.*?)(```)", re.S)


def command_output(argv: list[str]) -> str:
    """What ``vidcache ARGV`` prints (run in this process: the same parser and code as the command), on a node
    with no cache (a cache here would add its own URL cap to stock mode's server args)."""
    sys.path.insert(0, str(REPO))
    from vidcache.cli import main
    out = io.StringIO()
    saved = {k: os.environ.pop(k, None) for k in ("VIDCACHE_DIR", "VIDCACHE_SHARED", "VIDCACHE_SGLANG_VERSION")}
    try:
        with tempfile.TemporaryDirectory() as empty, contextlib.redirect_stdout(out):
            os.environ["VIDCACHE_DIR"] = os.path.join(empty, "none")
            rc = main(argv)
    finally:
        os.environ.pop("VIDCACHE_DIR", None)
        os.environ.update({k: v for k, v in saved.items() if v is not None})
    if rc != 0:
        raise SystemExit(f"vidcache {shlex.join(argv)} exited {rc}")
    return out.getvalue()


def blocks(text: str):
    """(argv, the block's text) for each generated block of ``text``."""
    return [(shlex.split(m["argv"]), m["body"]) for m in BLOCK.finditer(text)]


def regenerate(text: str) -> str:
    return BLOCK.sub(lambda m: m[1] + command_output(shlex.split(m["argv"])) + m[4], text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 on a difference")
    ap.add_argument("docs", nargs="*", default=[str(REPO / "docs" / "miles.md")])
    a = ap.parse_args(argv)
    stale = []
    for doc in map(Path, a.docs):
        text = doc.read_text()
        new = regenerate(text)
        if new != text:
            stale.append(str(doc))
            if not a.check:
                doc.write_text(new)
    if a.check and stale:
        print(f"stale generated blocks in {', '.join(stale)}: run python scripts/gen_launch_docs.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
