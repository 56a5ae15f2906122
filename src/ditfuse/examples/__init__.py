"""Runnable examples (``python -m ditfuse.examples.<name>``)."""
