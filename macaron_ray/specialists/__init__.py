"""The specialists: canonical public labels and their registry."""
