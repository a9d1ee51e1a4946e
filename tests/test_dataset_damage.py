"""D49 residuals, through the CLI on fresh nodes: a parquet file cut short (its footer gone) is one clear
`[dataset_format]` error from `pull` and `prewarm`, not an ArrowInvalid traceback; a JSON Lines file with a NUL
byte in one row loses that row only, not the whole file."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from support.cli import SHELL, run_cli
from vidcache.testing.videos import make_video


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    d = tmp_path_factory.mktemp("clips")
    return [make_video(str(d / f"{i}.mkv"), codec="ffv1", width=64, height=48, fps=10, n_frames=10, seed=40 + i)
            for i in range(5)]


def _cli(tmp_path, *args):
    return run_cli(args, tmp_path / "node", tmp_path / "tier", inherit=SHELL, timeout=300)


@pytest.mark.parametrize("verb", ["pull", "prewarm"])
def test_a_truncated_parquet_is_one_clear_error(tmp_path, clips, verb):
    ds = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "<video>", "videos": [c]} for c in clips]), ds)
    ds.write_bytes(ds.read_bytes()[: ds.stat().st_size // 2])        # a copy cut short: no footer
    r = _cli(tmp_path, verb, str(ds), "--min-pixels", "3136")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"vidcache: error: [dataset_format] {ds} cannot be read as parquet"), r.stderr
    assert "truncated" in r.stderr, r.stderr


def test_a_nul_byte_in_one_jsonl_row_costs_that_row_only(tmp_path, clips):
    """Before: a NUL anywhere in the first 64 KiB refused the whole file as "a binary file" (0 of 5 good rows)."""
    lines = [json.dumps({"prompt": "<video> q", "videos": [c]}).encode() for c in clips]
    lines.insert(1, b'{"prompt": "<video> \x00", "videos": ["x.mkv"]}')            # line 2
    ds = tmp_path / "train.jsonl"
    ds.write_bytes(b"\n".join(lines) + b"\n")
    r = _cli(tmp_path, "prewarm", str(ds), "--min-pixels", "3136", "--no-progress", "--allow-failures")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert "5 new" in r.stdout and "1 failed" in r.stdout, r.stdout
    assert "row 1 (line 2): [bad_row] line is not JSON" in r.stdout, r.stdout
