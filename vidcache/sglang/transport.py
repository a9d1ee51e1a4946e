"""How a video reaches an SGLang node, in stock mode (a frozen file) or plugin mode (a reference).

Stock mode sends a frozen file by URL.  Transports:
  ``shared``  the shared tier's own URL: a ``file://`` URI under an NFS root, or a presigned
              ``https`` URL for S3 (expiry configurable).  Readable from every node.  The default
              when the cache has a shared tier.  Where the SGLang nodes mount the NFS export at
              another path, ``$VIDCACHE_SHARED_SERVER_PATH`` names theirs: a path of this node's
              never crosses to another (the review's D26).
  ``file``    the node-local copy's ``file://`` URI: single-node set-ups only.  The default without one.
  ``http``    ``vidcache serve`` on some node (``base_url``).
  ``data``    inline, refused above SGLang's download cap.

Plugin mode sends a *reference* (``vidcache.rollout.ref``) as a ``data:`` URI.  It names the cache by
identity, never by a path, so the plugin resolves it through its own node's configuration; stock
SGLang cannot decode it, so a server started without the plugin fails loudly instead of silently
using stock semantics.
"""
from __future__ import annotations

import base64
import os
from urllib.parse import quote

from ..errors import ConfigError, OptionsError
from ..rollout.ref import ref_uri
from ..serving import SERVING_FORMAT, URL_EXPIRY_S
from ..sglang_facts import SGLANG_URL_CAP, stock_sglang_problems
from .frozen import BY_SUFFIX, local_frozen_path, published_frozen_key

TRANSPORTS = ("shared", "file", "http", "data")
ENV_SERVER_PATH = "VIDCACHE_SHARED_SERVER_PATH"    # the shared directory as the SGLang nodes mount it


def file_uri(path: str) -> str:
    """Percent-encoded ``file://`` URI: SGLang mishandles ``#``, ``?`` and ``%`` in plain paths."""
    return "file://" + quote(os.path.abspath(path))


def server_url(shared, url: str) -> str:
    """``url``, one of the shared tier's, as the SGLang nodes reach it: under ``$VIDCACHE_SHARED_SERVER_PATH``
    when that is set (their mount of this directory tier), else as this node sees it."""
    server_root = os.environ.get(ENV_SERVER_PATH)
    if not server_root:
        return url
    here = file_uri(shared.root)
    if not url.startswith(here + "/"):
        raise ConfigError(f"${ENV_SERVER_PATH} is set, but the shared tier {shared.url} is not a directory: its "
                          "URLs are the same from every node; unset it")
    if not os.path.isabs(server_root):
        raise ConfigError(f"${ENV_SERVER_PATH} must be an absolute path (the SGLang nodes' mount of "
                          f"{shared.url}), got {server_root!r}")
    return file_uri(server_root) + url[len(here):]


def default_transport(cache) -> str:
    return "shared" if cache.shared is not None else "file"


def check_stock_parity(manifest) -> None:
    """Refuse (``OptionsError``) an entry that stock SGLang cannot reproduce bit-exactly."""
    # The frames' own shape decides (grid None): frames that happen to sit on the stock grid are served.
    from .config import target_sglang
    problems = stock_sglang_problems(manifest.family, None, manifest.num_frames, manifest.height, manifest.width,
                                     sglang_version=target_sglang())
    if problems:
        raise OptionsError(f"cache entry {manifest.key} ({manifest.family}) cannot be served "
                           "in stock mode: " + " ".join(problems))


def video_uri(handle, mode: str = "stock", transport: str | None = None, base_url: str | None = None,
              frozen_format: str | None = None, expires_s: float = URL_EXPIRY_S, attest: dict | None = None,
              token_layout: str | None = None, ahead: list[str] | None = None, embeddings: dict | None = None) -> str:
    """The ``video_data`` entry SGLang gets for ``handle`` (plugin mode: with ``attest``, its attestation,
    ``token_layout``, the layout the plugin expands the prompt in, ``ahead``, keys the node may pull soon, and
    ``embeddings``, the tower whose precomputed embeddings to serve: ``Tower.as_dict()``)."""
    if mode == "plugin":
        if transport not in (None, "data"):
            raise ValueError("plugin mode sends a reference (a small data: URI); transport must be 'data'")
        return ref_uri(handle.identity, handle.resolve(), attest, token_layout, ahead, embeddings)
    if embeddings:
        raise ValueError("precomputed embeddings are served in plugin mode only")
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
        return server_url(cache.shared, cache.shared.url_for(published_frozen_key(cache, key, fmt), expires_s))
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
