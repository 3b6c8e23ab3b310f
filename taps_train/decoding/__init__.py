"""Speculative decoding in plain PyTorch: draft trees, verification, lossless acceptance, the loop."""
