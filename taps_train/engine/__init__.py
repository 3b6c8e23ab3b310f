"""Serving engines: taps-train exports decoded in vLLM, and how their behaviour compares with taps-train's own."""
