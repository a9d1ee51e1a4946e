"""D54 in the Miles data source: the prompt file's images and videos follow vidcache's source rule, and
``--vidcache-media-root`` widens it as ``prewarm --media-root`` does (against Miles' own modules: MILES_SRC)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from support.miles_compat import miles_or_skip

REPO = Path(__file__).resolve().parents[1]
MILES = miles_or_skip(REPO)       # Miles present: from here on a missing peer is a failure, never a skip

from miles_integration.args import VidcacheConfig, add_vidcache_arguments  # noqa: E402
from miles_integration.data_source import VidcacheDataset  # noqa: E402
from vidcache.errors import OutsideMediaRootError  # noqa: E402


def test_miles_rows_follow_the_source_rule(tmp_path):
    ds_dir, outside = tmp_path / "ds", tmp_path / "pictures"
    ds_dir.mkdir()
    outside.mkdir()
    rows = [{"text": "<image> one", "images": ["../pictures/p.png"]},
            {"text": [{"role": "user", "content": [{"type": "image", "image": "../../../../etc/passwd"}]}]}]
    (ds_dir / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    parser = add_vidcache_arguments(argparse.ArgumentParser())

    def dataset(*flags):
        cfg = VidcacheConfig.from_args(parser.parse_args(["--vidcache-cache", str(tmp_path / "node"), *flags]))
        return VidcacheDataset(str(ds_dir / "rows.jsonl"), None, config=cfg, prompt_key="text",
                               multimodal_keys={"image": "images"})

    plain = dataset()
    for i in (0, 1):
        with pytest.raises(OutsideMediaRootError, match="--vidcache-media-root"):
            plain._miles_data(plain.rows[i])
    wide = dataset("--vidcache-media-root", str(outside))
    data, _ = wide._miles_data(wide.rows[0])
    assert data["images"] == [str(outside / "p.png")]
    with pytest.raises(OutsideMediaRootError, match="outside every --media-root"):
        wide._miles_data(wide.rows[1])
