"""Key formats and namespaces: the one module that knows what a store key means.

Bazel's vocabulary:
  ``cas/<digest>``          frame blobs, addressed by the xxh3-128 digest of their bytes (content-addressed)
  ``ac/<key>``              manifests (the "action cache"), addressed by the cache key
  ``src/<id>``              source records: source -> content digest, with fsspec's validators
  ``frozen/<key><suffix>``  frozen files for SGLang (same frames, another encoding)
  ``frozen-digest/<key><suffix>``  the digest of that tier's frozen file, recorded when it was verified
  ``emb/<key>.<32 hex>``    an entry's vision embeddings (``vidcache.embeddings``): the entry key, then a digest of
                            the tower's weights, dtype and code; the value is sealed with its own digest
  ``quarantine/...``        corrupt objects moved aside (never served, kept for inspection)
  ``meta/tier``             a shared tier's identity (the object ``meta/c1/tier``: ``TIER_OBJECT``)

Stores know bytes and keys only; tier policy is stated here as data (``LOCAL_ONLY``)
and handed to the stores by the cache.  Every key that arrives from outside (a
request, a CLI argument, a handle) passes :func:`check_key` before any store call.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

import xxhash

from .digest import ALGO, Digest
from .errors import InvalidKeyError

if TYPE_CHECKING:
    from .options import VideoOptions

CAS, AC, SRC, FROZEN, QUARANTINE, META = "cas/", "ac/", "src/", "frozen/", "quarantine/", "meta/"
FROZEN_DIGEST = "frozen-digest/"
EMB = "emb/"
TIER = META + "tier"          # a shared tier's identity record (see vidcache.identity)
# Where that record lies under a shared tier's root, on a directory and in a bucket alike: the fsspec store fans
# each namespace out 256 ways by a hash of the name (FsspecStore._path), so meta/tier is the object meta/c1/tier.
# What an operator backs up, restores or writes a bucket policy for; tests/test_docs_code.py checks the two agree.
TIER_OBJECT = META + "c1/tier"

# Prefixes that stay on the node.  None today: source records are shared too, so a node that can see a
# source (an S3 object, an NFS path) finds its entry without fetching and hashing it again.  A record is
# trusted only when the source's validators (size + ETag, or size + mtime + inode) still match, so a
# same-named but different file on another node is simply a miss there.
LOCAL_ONLY: tuple[str, ...] = ()

# <xxh3-128 of the source bytes>.<size>.<options digest>: hex, digits and dots, nothing else.
# An entry key: <source xxh3-128>.<source bytes>.<options digest>; the one spelling (servers match paths by it).
KEY_PATTERN = r"[0-9a-f]{32}\.[0-9]{1,20}\.[0-9a-f]{32}"
_KEY = re.compile(KEY_PATTERN)
# The start of a key as a person gives one (`vidcache ls` prints 16 hex digits): at least 4 hex digits, then as
# much of the rest of KEY_PATTERN as is given; the CLI completes it over a cache's entries.
_KEY_PREFIX = re.compile(r"[0-9a-f]{4,32}(\.[0-9]{0,20}(\.[0-9a-f]{0,32})?)?")
# An embedding record's id (``EmbeddingKey.id``): the entry key, then xxh3-128 of (weights digest, dtype, code).
_EMB_ID = re.compile(KEY_PATTERN + r"\.[0-9a-f]{32}")
_BLOB = re.compile(re.escape(ALGO) + r":[0-9a-f]{32}:[0-9]{1,20}")


def cache_key(source_digest: Digest, options: "VideoOptions") -> str:
    """The action key: content digest plus options digest.  Paths, URLs and workers never enter it."""
    return f"{source_digest.hash}.{source_digest.size_bytes}.{options.digest}"


def is_key(key: object) -> bool:
    return isinstance(key, str) and _KEY.fullmatch(key) is not None


def is_key_prefix(text: object) -> bool:
    """Whether ``text`` is a key or the start of one (at least 4 hex digits)."""
    return isinstance(text, str) and _KEY_PREFIX.fullmatch(text) is not None


def check_key(key: object) -> str:
    """``key`` if it is a well-formed cache key, else ``InvalidKeyError`` (no store is touched)."""
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        shown = repr(key)[:80]
        raise InvalidKeyError(f"not a vidcache key: {shown} (expected <32 hex>.<size>.<32 hex>)")
    return key


def check_blob(blob: object) -> str:
    if not isinstance(blob, str) or not _BLOB.fullmatch(blob):
        raise InvalidKeyError(f"not a blob digest: {repr(blob)[:80]}")
    return blob


def source_digest_of(key: str) -> Digest:
    h, size, _ = check_key(key).split(".")
    return Digest(h, int(size))


def ac(key: str) -> str:
    return AC + check_key(key)


def cas(blob: str) -> str:
    return CAS + check_blob(blob)


def src(source: str) -> str:
    return SRC + xxhash.xxh3_128_hexdigest(source.encode("utf-8", "surrogatepass"))


def frozen(key: str, suffix: str) -> str:
    return FROZEN + check_key(key) + suffix


def frozen_digest(key: str, suffix: str) -> str:
    return FROZEN_DIGEST + check_key(key) + suffix


def emb(emb_id: str) -> str:
    """The store key of an embedding record (``EmbeddingKey.id``)."""
    if not isinstance(emb_id, str) or not _EMB_ID.fullmatch(emb_id):
        raise InvalidKeyError(f"not an embedding id: {repr(emb_id)[:80]} (expected <entry key>.<32 hex>)")
    return EMB + emb_id


def quarantined(store_key: str) -> str:
    """Where a corrupt object is moved aside: one flat name (stores keep one level under a namespace)."""
    return QUARANTINE + store_key.replace("/", "~", 1)


def entry_key(store_key: str) -> str:
    """The cache key of an ``ac/`` store key."""
    if not store_key.startswith(AC):
        raise InvalidKeyError(f"not a manifest key: {store_key!r}")
    return check_key(store_key[len(AC):])
