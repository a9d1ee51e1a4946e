#!/usr/bin/env python
"""Thin wrapper: ``python scripts/prewarm.py DATASET.jsonl [...]`` == ``vidcache prewarm DATASET.jsonl [...]``."""
import sys

from vidcache.cli import main

if __name__ == "__main__":
    sys.exit(main(["prewarm", *sys.argv[1:]]))
