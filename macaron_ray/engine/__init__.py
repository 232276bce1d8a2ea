"""Engines: how the project starts and talks to vLLM."""
