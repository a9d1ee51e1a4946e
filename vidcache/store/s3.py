"""A shared tier on S3 (``s3://bucket/prefix``, through s3fs).

What S3 adds to ``FsspecStore``: bounded botocore timeouts and retries (``s3_storage_options``); one GET per read
(no HEAD first) and a streamed GET whose length is checked before its body and which resumes where a cut
connection stopped; conditional PUTs (``If-None-Match: *``) for ``set_if_not_exists``; presigned URLs.  PUTs are
atomic per object, so no partial object is ever visible and nothing is left to sweep.
"""
from __future__ import annotations

import asyncio
import functools
from typing import Mapping

import fsspec
import fsspec.asyn

from ..errors import OversizedObjectError
from .fsspec import STREAM_PIECE, FsspecStore, _s3_stack

# botocore's own defaults let one S3 call retry for minutes: s3fs retries 5 times around botocore's 5
# "legacy" attempts, each allowed 15 s to read (D21: calls to a stopped endpoint were killed after 330 s).
# Per-request bounds, so a stuck connection is retried well inside the call's limit; "standard" retries
# back off with jitter and also cover throttling and 5xx.  Whatever the user sets in config_kwargs wins.
S3_CONFIG_KWARGS = {"connect_timeout": 5, "read_timeout": 15,
                    "retries": {"mode": "standard", "total_max_attempts": 3}}


def s3_storage_options(user: Mapping) -> dict:
    """``user``'s S3 storage options with bounded timeouts and retries filled in where neither they nor
    fsspec's configuration (``FSSPEC_S3_CONFIG_KWARGS``...) set them."""
    given = {**fsspec.config.conf.get("s3", {}), **user}
    return {**user, "config_kwargs": {**S3_CONFIG_KWARGS, **(given.get("config_kwargs") or {})}}


class S3Store(FsspecStore):
    protocols = ("s3", "s3a")
    supports_urls = True             # presigned
    exclusive_create = True          # a conditional PUT
    _busy_is_unavailable = True      # s3fs reports S3's SlowDown/503 as EBUSY

    def _storage_options(self) -> dict:
        return s3_storage_options(self.storage_options)

    def get(self, key: str) -> bytes | None:
        # One GET, no HEAD to size it first (max_concurrency=1: s3fs would send one to plan ranges): not bounded
        # here.  What is large on S3, a compact object, is read by ``stream``, which checks the GET's
        # Content-Length before its body.
        try:
            return self._call(f"get {key}", self.fs.cat_file, self._path(key), max_concurrency=1)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def _stream(self, key: str, path: str, sink):
        bucket, name, _ = self.fs.split_path(path)

        async def pump() -> None:
            # A connection cut part-way resumes where it stopped, as s3fs retries a whole GET (same errors, same
            # backoff); If-Match keeps the resumed bytes those of the object begun.
            got, etag = 0, None
            for attempt in range(max(1, self.fs.retries)):
                resume = {"Range": f"bytes={got}-", "IfMatch": etag} if got else {}
                resp = await self.fs._call_s3("get_object", Bucket=bucket, Key=name, **resume)
                etag, body = resp.get("ETag"), resp["Body"]
                if not got:                   # the whole object's length, before its body is read
                    try:
                        self._check_size(key, resp.get("ContentLength"))
                    except OversizedObjectError:
                        body.close()
                        raise
                try:
                    while chunk := await body.read(STREAM_PIECE):
                        sink(chunk)
                        got += len(chunk)
                    return
                except _s3_stack()[2]:
                    if attempt + 1 >= self.fs.retries or etag is None:
                        raise
                    await asyncio.sleep(min(1.7 ** attempt * 0.1, 15))
                finally:
                    body.close()
        return functools.partial(fsspec.asyn.sync, self.fs.loop, pump)

    def url_for(self, key: str, expires_s: float | None = None) -> str:
        if expires_s is None:     # the default lives with the other serving facts (vidcache.serving)
            raise ValueError("a presigned URL needs expires_s (vidcache.serving.URL_EXPIRY_S)")
        return self.fs.sign(self._path(key), expiration=int(expires_s))
