"""Helpers the tests share (not test modules): SGLang's own processor as a peer (``sglang_peer``), the toy HF
processors (``toy_processors``), finding Miles (``miles_compat``), the Miles smoke example
(``miles_smoke_example``), node B of the cross-node scenario (``node_b``, run as its own process), the CLI as a
user runs it on a fresh node (``cli``) and damage done on purpose (``damage``).

``tests/`` is on ``sys.path`` (``tests/conftest.py``), so tests import them as ``from support import ...``.
"""
