"""Runnables, each run as `python -m scripts.NAME`; nothing imports them but the tests."""
