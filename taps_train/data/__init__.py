"""Data: reading sources into conversations (later: recipes, masks, feature cache, datamodule)."""
