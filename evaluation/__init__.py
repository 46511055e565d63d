"""Evaluation: the inference agent (training's rollout replayed), per-sample records and metrics, a resumable run,
the HTML report."""
