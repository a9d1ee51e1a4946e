"""The plugin-mode reference: what a request names instead of a video, and how an engine's adapter reads it
(SGLang's plugin, ``vidcache.sglang.plugin``; vLLM's loader, ``vidcache.vllm.loader``): engine-neutral, so both
read the same format through the same parser.

``data:application/vnd.vidcache.ref+json;base64,<JSON>`` with
``{"vidcache_ref": 4, "tier": <cache identity>, "key": <entry key>, "attest": <record>, "layout": <name>}``:
it names the cache by identity, never by a path, so the plugin resolves it through its own node's
configuration.  ``attest`` (``vidcache.attest``) is the trainer's digest of the tensors for this video,
which the plugin checks against its own processor output; it may be absent (attestation switched off).
``layout`` (``vidcache.token_layout``) is the token layout of the trainer's ids, which the plugin expands the
prompt in whatever its transformers' own is; absent: the server's own.  Version-2 (no ``attest``) and
version-3 (no ``layout``) references are still read; a plugin older than version 4 refuses these, by name.

``embeddings`` (version 5, optional): serve this video's precomputed vision embeddings instead of running the tower:
the tower's ``{"weights", "dtype", "code"}`` (``vidcache.rollout.embeddings.Tower``), which with ``key`` make the
record's ``EmbeddingKey``; the server's lookup must return a record for exactly that key.  A reference with it is
written as version 5, so a plugin that cannot serve embeddings refuses it by its version, never serves frames instead.

``ahead`` (optional, any version): keys of entries the client will ask for soon (its next batch's), which the
node pulls from the shared tier into its local tier in the background (``vidcache.readahead.pull_soon``): a
hint, checked like every key, bounded (``MAX_AHEAD`` per reference), never a path.

Parsing treats the URI as hostile: the size is capped before decoding, the JSON depth is capped (a
deeply nested document is refused, never a ``RecursionError``), every field is type-checked, and no
error echoes more than a short prefix of what the request sent.
"""
from __future__ import annotations

import base64
import json
import threading

from .. import keys
from ..attest import check_record
from ..errors import InvalidKeyError
from ..identity import ANY_ID
from ..families import FAMILIES

REF_MEDIA_TYPE = "application/vnd.vidcache.ref+json"
REF_PREFIX = f"data:{REF_MEDIA_TYPE};base64,"
REF_VERSION = 4
EMBEDDINGS_VERSION = 5               # a reference that asks for precomputed embeddings
READ_VERSIONS = (2, 3, 4, 5)         # 2: the same without "attest"; 3: without "layout"; 5: with "embeddings"
MAX_REF_CHARS = 256 << 10            # an attested canary with its rows is ~25 KB; a plain reference ~300 bytes
MAX_DEPTH = 4                        # {"attest": {"video_grid_thw": [...]}} is 3 deep
MAX_AHEAD = 32                       # keys a reference may name ahead (a rollout batch's videos)
_OPEN_LOCK = threading.Lock()


def ref_uri(tier: str, key: str, attest: dict | None = None, layout: str | None = None,
            ahead: list[str] | None = None, embeddings: dict | None = None) -> str:
    rec = {"vidcache_ref": EMBEDDINGS_VERSION if embeddings else REF_VERSION, "tier": tier, "key": key}
    if embeddings:
        rec["embeddings"] = dict(embeddings)
    if attest is not None:
        rec["attest"] = attest
    if layout is not None:
        rec["layout"] = layout
    if ahead:
        rec["ahead"] = list(ahead)[:MAX_AHEAD]
    return REF_PREFIX + base64.b64encode(json.dumps(rec, sort_keys=True).encode()).decode()


def _depth(s: str) -> int:
    """Deepest bracket nesting of a JSON text, counted without parsing (strings skipped)."""
    depth = deepest = 0
    in_str = esc = False
    for ch in s:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                return deepest
        elif ch in "]}":
            depth -= 1
    return deepest


def _short(x) -> str:
    r = repr(x)
    return r if len(r) <= 60 else r[:60] + "..."


def parse_ref(uri: str) -> dict | None:
    """The reference record in a plugin-mode URI, or None if ``uri`` is not one.

    JSON only, never pickle; never opens a file.  The key is checked against the key format here,
    before any store is touched.
    """
    if not uri.startswith(REF_PREFIX):
        return None
    if len(uri) > MAX_REF_CHARS:
        raise InvalidKeyError(f"vidcache reference of {len(uri)} characters; at most {MAX_REF_CHARS} are read")
    try:
        text = base64.b64decode(uri[len(REF_PREFIX):], validate=True).decode()
        if _depth(text) > MAX_DEPTH:
            raise ValueError(f"nested deeper than {MAX_DEPTH}")
        rec = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidKeyError(f"malformed vidcache reference ({e.__class__.__name__}): {uri[:120]}") from None
    if not isinstance(rec, dict) or rec.get("vidcache_ref") not in READ_VERSIONS:
        raise InvalidKeyError(f"not a version-{REF_VERSION} vidcache reference: {uri[:120]}")
    unknown = set(rec) - {"vidcache_ref", "tier", "key", "attest", "layout", "ahead", "embeddings"}
    if unknown:
        raise InvalidKeyError(f"vidcache reference with unknown field(s) {_short(sorted(unknown))}")
    tier = rec.get("tier")
    if not isinstance(tier, str) or not ANY_ID.fullmatch(tier):
        raise InvalidKeyError(f"vidcache reference with a malformed tier identity {_short(tier)}")
    keys.check_key(rec.get("key"))
    layout = rec.get("layout")
    if layout is not None and not (isinstance(layout, str) and any(layout in f.layouts for f in FAMILIES.values())):
        raise InvalidKeyError(f"vidcache reference with an unknown token layout {_short(layout)}")
    ahead = rec.get("ahead")
    if ahead is not None:
        if not isinstance(ahead, list) or len(ahead) > MAX_AHEAD:
            raise InvalidKeyError(f"vidcache reference whose 'ahead' is not a list of at most {MAX_AHEAD} keys")
        for k in ahead:
            keys.check_key(k)
    emb = rec.get("embeddings")
    if (emb is not None) != (rec["vidcache_ref"] == EMBEDDINGS_VERSION):
        raise InvalidKeyError(f"a version-{EMBEDDINGS_VERSION} vidcache reference, and only one, names embeddings")
    if emb is not None and not (isinstance(emb, dict) and set(emb) == {"weights", "dtype", "code"}
                                and all(isinstance(v, str) and 0 < len(v) <= 200 for v in emb.values())):
        raise InvalidKeyError("vidcache reference whose 'embeddings' is not {weights, dtype, code} (short strings)")
    if rec.get("attest") is not None:
        try:
            check_record(rec["attest"])
        except ValueError as e:
            raise InvalidKeyError(f"vidcache reference with a malformed attestation: {e}") from None
    return rec


def open_ref(rec: dict):
    """``(manifest, frames)`` of a parsed reference (``parse_ref``), from *this node's* cache only: the engine-side
    half every rollout adapter shares (the SGLang plugin, vLLM's loader ``vidcache.vllm.loader``).

    The cache is the node's (``VIDCACHE_DIR`` + ``VIDCACHE_SHARED``): a request never names a path, so it can neither
    make the server open or create a store where it likes, nor reach another cache.  A reference to another cache
    raises ``TierMismatchError``; an unknown key ``NotCachedError``.
    """
    from ..errors import TierMismatchError
    from ..node import node_cache
    with _OPEN_LOCK:            # node_cache memoises per process, but engines load items on several threads at once
        cache = node_cache()
    if rec["tier"] != cache.identity:
        raise TierMismatchError(f"reference to cache {rec['tier']!r}, but this server's cache is "
                                f"{cache.identity!r}: start it with VIDCACHE_SHARED set to that cache's shared tier")
    key = rec["key"]              # checked against the key format by parse_ref
    # frames(key) first: on a node without the entry it fetches the manifest and the compact object side by side
    # and decodes the object as it arrives; the manifest is then the cache's memoised one.
    frames = cache.frames(key)
    if rec.get("ahead"):          # the client's next entries: pulled in the background, this read served first
        from ..readahead import pull_soon
        pull_soon(cache, rec["ahead"])
    return cache.require_manifest(key), frames
