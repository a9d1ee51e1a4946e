"""How a frozen video reaches an SGLang node: ``file`` (shared filesystem), ``http`` (served from
the cache by ``vidcache serve``), or ``data`` (inline, for small clips).

Stock mode sends the frozen FFV1 file itself.  Plugin mode sends a *reference*:
a small JSON record ``{"cache": ..., "key": ...}`` (as a ``.vidcache`` file or a
``data:`` URI) that vidcache's SGLang plugin resolves to cached frames and
metadata.  Stock SGLang cannot decode a reference, so a server started
without the plugin fails loudly instead of silently using stock semantics.
"""
from __future__ import annotations

import base64
import json
import os
import tempfile
from urllib.parse import quote

TRANSPORTS = ("file", "http", "data")
# Stock SGLang decodes the frozen file on every request: UT Video decodes ~5x faster than FFV1
# (benchmarks/formats.py, benchmarks/sglang_frozen_cost.py); both are bit-exact.
SERVING_FORMAT = "utvideo"
SGLANG_DATA_CAP = 64 << 20          # SGLang's default --media-url-max-file-size-mb
REF_SUFFIX = ".vidcache"
REF_MEDIA_TYPE = "application/vnd.vidcache.ref+json"


def file_uri(path: str) -> str:
    """Percent-encoded ``file://`` URI: SGLang mishandles ``#``, ``?`` and ``%`` in plain paths."""
    return "file://" + quote(os.path.abspath(path))


def ref_record(handle) -> dict:
    return {"vidcache_ref": 1, "cache": handle.cache, "key": handle.resolve()}


def ref_path(handle) -> str:
    """Write (once, atomically) and return the ``.vidcache`` reference file for ``handle``."""
    key = handle.resolve()
    path = os.path.join(handle.cache, "refs", key + REF_SUFFIX)
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".ref-")
        with os.fdopen(fd, "w") as f:
            json.dump(ref_record(handle), f)
        os.replace(tmp, path)
    return path


def video_uri(handle, mode: str = "stock", transport: str = "file", base_url: str | None = None,
              frozen_format: str | None = None) -> str:
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
    if mode == "plugin":
        if transport == "data":
            blob = base64.b64encode(json.dumps(ref_record(handle)).encode()).decode()
            return f"data:{REF_MEDIA_TYPE};base64,{blob}"
        if transport == "http":
            raise ValueError("plugin mode reads frames from the cache directory itself; "
                             "use transport 'file' or 'data' (the reference is tiny)")
        return file_uri(ref_path(handle))
    from .sglang.config import check_stock_parity
    check_stock_parity(handle.manifest)     # refuse, before SGLang silently re-samples or resizes
    path = handle.frozen_path(frozen_format or SERVING_FORMAT)
    if transport == "file":
        return file_uri(path)
    if transport == "http":
        return _http(base_url, f"frozen/{os.path.basename(path)}")
    size = os.path.getsize(path)
    if size * 4 // 3 + 64 > SGLANG_DATA_CAP:
        raise ValueError(f"frozen file is {size} bytes; as a data: URI it exceeds SGLang's "
                         f"{SGLANG_DATA_CAP >> 20} MiB default cap: use transport 'file' or 'http'")
    from .loader.frozen import FORMATS
    media = {f.suffix: f.media_type for f in FORMATS.values()}[os.path.splitext(path)[1]]
    with open(path, "rb") as f:
        return f"data:{media};base64," + base64.b64encode(f.read()).decode()


def _http(base_url: str | None, rel: str) -> str:
    if not base_url:
        raise ValueError("transport 'http' needs base_url (the address of `vidcache serve`)")
    return base_url.rstrip("/") + "/" + rel


def parse_ref(uri: str) -> dict | None:
    """The reference record in a plugin-mode URI, or None if ``uri`` is not one.  JSON only, never pickle."""
    from urllib.parse import unquote, urlparse
    if uri.startswith(f"data:{REF_MEDIA_TYPE};base64,"):
        rec = json.loads(base64.b64decode(uri.split(",", 1)[1], validate=True))
    elif uri.endswith(REF_SUFFIX) and not uri.startswith(("http://", "https://")):
        path = unquote(urlparse(uri).path) if uri.startswith("file:") else uri
        with open(path) as f:
            rec = json.load(f)
    else:
        return None
    if not isinstance(rec, dict) or rec.get("vidcache_ref") != 1 or not {"cache", "key"} <= set(rec):
        raise ValueError(f"not a vidcache reference: {uri[:120]}")
    return rec
