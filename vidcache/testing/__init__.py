"""Helpers for tests, benchmarks and the demo: synthetic videos and shared contract suites."""

from .processors import toy_processor  # noqa: E402,F401  (cheap: transformers is imported when one is built)
