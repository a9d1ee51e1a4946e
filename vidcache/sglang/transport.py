"""How a video reaches an SGLang node, in stock mode (a frozen file) or plugin mode (a reference).

Stock mode sends a frozen file by URL.  Transports:
  ``shared``  the shared tier's own URL: a ``file://`` URI under an NFS root, or a presigned
              ``https`` URL for S3 (expiry configurable).  Readable from every node.  The default
              when the cache has a shared tier.
  ``file``    the node-local copy's ``file://`` URI: single-node set-ups only.  The default without one.
  ``http``    ``vidcache serve`` on some node (``base_url``).
  ``data``    inline, refused above SGLang's download cap.

Plugin mode sends a *reference*: ``{"vidcache_ref": 2, "tier": <cache identity>, "key": <key>}``
as a ``data:`` URI.  It names the cache by identity, never by a path, so the plugin
resolves it through its own node's configuration; stock SGLang cannot decode it, so a
server started without the plugin fails loudly instead of silently using stock semantics.
"""
from __future__ import annotations

import base64
import json
import os
from urllib.parse import quote

from .. import keys
from ..errors import InvalidKeyError
from .config import check_stock_parity
from .frozen import BY_SUFFIX, SERVING_FORMAT, local_frozen_path, published_frozen_key

TRANSPORTS = ("shared", "file", "http", "data")
SGLANG_URL_CAP = 64 << 20          # SGLang's default --media-url-max-file-size-mb, in bytes
REF_MEDIA_TYPE = "application/vnd.vidcache.ref+json"
REF_PREFIX = f"data:{REF_MEDIA_TYPE};base64,"
REF_VERSION = 2
DEFAULT_URL_EXPIRY_S = 7 * 24 * 3600


def file_uri(path: str) -> str:
    """Percent-encoded ``file://`` URI: SGLang mishandles ``#``, ``?`` and ``%`` in plain paths."""
    return "file://" + quote(os.path.abspath(path))


def default_transport(cache) -> str:
    return "shared" if cache.shared is not None else "file"


def ref_uri(handle) -> str:
    rec = {"vidcache_ref": REF_VERSION, "tier": handle.tier, "key": handle.resolve()}
    return REF_PREFIX + base64.b64encode(json.dumps(rec, sort_keys=True).encode()).decode()


def parse_ref(uri: str) -> dict | None:
    """The reference record in a plugin-mode URI, or None if ``uri`` is not one.

    JSON only, never pickle; never opens a file.  The key is checked against the key format here,
    before any store is touched.
    """
    if not uri.startswith(REF_PREFIX):
        return None
    try:
        rec = json.loads(base64.b64decode(uri[len(REF_PREFIX):], validate=True))
    except (ValueError, UnicodeDecodeError):
        raise InvalidKeyError(f"malformed vidcache reference: {uri[:120]}") from None
    if not isinstance(rec, dict) or rec.get("vidcache_ref") != REF_VERSION or not isinstance(rec.get("tier"), str):
        raise InvalidKeyError(f"not a version-{REF_VERSION} vidcache reference: {uri[:120]}")
    keys.check_key(rec.get("key"))
    return rec


def video_uri(handle, mode: str = "stock", transport: str | None = None, base_url: str | None = None,
              frozen_format: str | None = None, expires_s: float = DEFAULT_URL_EXPIRY_S) -> str:
    """The ``video_data`` entry SGLang gets for ``handle``."""
    if mode == "plugin":
        if transport not in (None, "data"):
            raise ValueError("plugin mode sends a reference (a small data: URI); transport must be 'data'")
        return ref_uri(handle)
    cache = handle.cache
    transport = transport or default_transport(cache)
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
    key = handle.resolve()
    check_stock_parity(cache.require_manifest(key))   # refuse, before SGLang silently re-samples or resizes
    fmt = frozen_format or SERVING_FORMAT
    if transport == "shared":
        if cache.shared is None or not cache.shared.supports_urls:
            raise ValueError(f"{cache!r} has no shared tier that hands out URLs (an NFS path or s3://); "
                             "use transport 'http' (vidcache serve) or 'data'")
        return cache.shared.url_for(published_frozen_key(cache, key, fmt), expires_s)
    path = local_frozen_path(cache, key, fmt)
    if transport == "file":
        return file_uri(path)
    if transport == "http":
        if not base_url:
            raise ValueError("transport 'http' needs base_url (the address of `vidcache serve`)")
        return base_url.rstrip("/") + "/frozen/" + os.path.basename(path)
    size = os.path.getsize(path)
    if size * 4 // 3 + 64 > SGLANG_URL_CAP:
        raise ValueError(f"frozen file is {size} bytes; as a data: URI it exceeds SGLang's "
                         f"{SGLANG_URL_CAP >> 20} MiB default cap: use transport 'shared' or 'http'")
    with open(path, "rb") as f:
        return f"data:{BY_SUFFIX[os.path.splitext(path)[1]].media_type};base64," + base64.b64encode(f.read()).decode()
