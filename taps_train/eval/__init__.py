"""Evaluation: benchmarks, acceptance-length metrics and callback, reports."""
