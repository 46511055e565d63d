"""Helpers the entry scripts and the trainer share: recipes, model loading, start-up checks, the rollout token
budget, resume, vLLM tool images, diagnostics, memory estimates."""
