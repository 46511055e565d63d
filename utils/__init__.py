"""Shared by the entry scripts and the trainer: recipe parsing, model loading, start-up checks, the registry, LoRA
targets, the policy's load and save, diagnostics."""
