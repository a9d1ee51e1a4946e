"""``vidcache.cli.prefixes.streamed_prefixes``: the abbreviated keys ``ls`` prints, made as a sorted listing passes
(issue 50: ``ls`` held a prefix table of every key).  Checked against the rule itself, not against an earlier
implementation: each prefix is the shortest of at least 16 characters that no other key starts with, never ending
on a ``.``."""
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from vidcache.cli.prefixes import MIN_PREFIX, streamed_prefixes

# Keys shaped as the cache's (<32 hex>.<size>.<32 hex>), from few digits so that long shared prefixes are common.
HEX = st.text("0a", min_size=32, max_size=32)
KEYS = st.lists(st.builds("{}.{}.{}".format, HEX, st.sampled_from([7, 70, 700]), HEX), unique=True, max_size=40)


def shortest(key: str, others: list[str]) -> str:
    for n in itertools.count(MIN_PREFIX):
        p = key[:n]
        if n >= len(key) or (not p.endswith(".") and not any(o.startswith(p) for o in others)):
            return p


@settings(max_examples=300, deadline=None)
@given(KEYS)
def test_each_prefix_is_the_shortest_no_other_key_starts_with(ks):
    ks = sorted(ks)
    got = list(streamed_prefixes(ks))
    assert [k for k, _ in got] == ks
    for k, p in got:
        others = [o for o in ks if o != k]
        assert p == shortest(k, others), (k, p)
        assert not any(o.startswith(p) for o in others)


def test_items_pass_with_one_item_of_look_ahead():
    """The walk is consumed as it goes: when an item comes out, at most the next one has been taken."""
    ks = sorted(f"{i:032x}.10.{i:032x}" for i in range(1000))
    taken = []

    def source():
        for i, k in enumerate(ks):
            taken.append(i)
            yield (k, i)
    for (k, i), p in streamed_prefixes(source(), key=lambda item: item[0]):
        assert len(taken) <= i + 2
        assert k.startswith(p) and len(p) >= MIN_PREFIX
