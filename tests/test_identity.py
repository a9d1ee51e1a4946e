"""``vidcache.identity``: a node-local identity is made once, a shared tier's once in the tier itself; a lost or
corrupt record is refused with its repair, restored once and never replaced; one statement of what an identity
looks like."""
import json

import pytest

from vidcache import keys
from vidcache.config import NODE_FILE
from vidcache.errors import ConfigError, StoreError
from vidcache.identity import (ANY_ID, SHARED_ID, local_identity, new_shared_id, set_shared_identity,
                               shared_identity, tier_record)
from vidcache.store.memory import MemoryStore


# --- a cache without a shared tier ------------------------------------------------------------------------
def test_local_identity_is_made_once_and_only_when_asked(tmp_path):
    assert local_identity(str(tmp_path), create=False) is None and not (tmp_path / NODE_FILE).exists()
    first = local_identity(str(tmp_path), create=True)
    assert first.startswith("local-") and len(first) == len("local-") + 32
    assert local_identity(str(tmp_path), create=True) == first == local_identity(str(tmp_path), create=False)





# --- the shared tier's identity ---------------------------------------------------------------------------
def test_shared_identity_is_made_once_in_the_tier():
    tier = MemoryStore()
    with pytest.raises(StoreError, match="not an initialised vidcache shared tier"):
        shared_identity(tier, create=False)
    ident = shared_identity(tier, create=True)
    assert ident.startswith("tier-") and len(ident) == len("tier-") + 32
    assert shared_identity(tier, create=True) == ident == shared_identity(tier, create=False)
    assert json.loads(tier.get(keys.TIER)) == {"tier_id": ident}


def test_a_tier_with_objects_but_no_identity_is_refused_not_renamed():
    tier = MemoryStore({"ac/x": b"{}"})
    with pytest.raises(StoreError, match="--restore"):
        shared_identity(tier, create=True)
    assert tier.get(keys.TIER) is None                                 # no new identity was made


@pytest.mark.parametrize("raw", [b"not json", b"{}", b'{"tier_id": 7}', b'{"tier_id": "tier-xyz"}', b"[]"])
def test_a_corrupt_identity_record_names_the_repair(raw):
    with pytest.raises(StoreError, match="corrupt"):
        shared_identity(MemoryStore({keys.TIER: raw}), create=True)


def test_an_identity_is_restored_once_and_never_replaced():
    tier = MemoryStore({"ac/x": b"{}"})
    old = "tier-" + "ab" * 16
    assert set_shared_identity(tier, old) == old == shared_identity(tier, create=False)
    with pytest.raises(ConfigError, match=f"already has identity {old}"):
        set_shared_identity(tier, None)
    with pytest.raises(ConfigError, match="not a tier identity"):
        tier_record("tier-" + "AB" * 16)
    with pytest.raises(ConfigError, match="not a tier identity"):
        set_shared_identity(MemoryStore(), "local-" + "0" * 32)


# --- what an identity looks like ----------------------------------------------------------------------------
def test_identities_made_here_have_the_shapes_stated_once(tmp_path):
    shared, local = new_shared_id(), local_identity(str(tmp_path), create=True)
    assert SHARED_ID.fullmatch(shared) and shared != new_shared_id()
    assert ANY_ID.fullmatch(shared) and ANY_ID.fullmatch(local)       # a reference may name either
    assert not SHARED_ID.fullmatch(local)                              # a node-local id is no tier's record
    assert not ANY_ID.fullmatch("t" * 81) and not ANY_ID.fullmatch("../x/y")
