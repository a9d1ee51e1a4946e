"""Helpers for tests, benchmarks and the demo: synthetic videos and shared contract suites."""
