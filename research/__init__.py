"""Research beside the product: the controlled experiment (`python -m research.experiment`, `make experiment`), the
probes of the tiny world (`localization_probe`, `zoom_necessity`, `hpo_solvers`), the experiment world's rewards and
ground-truth verifiers, and its recipe (`research/recipes/`). It imports the product; the product never imports it
(`tests/test_layout.py`). Its rewards and verifiers reach `rl.py` by import path in the recipes
(`reward_funcs: [research.rewards:simulated_reader_reward]`), since the experiment runs `rl.py` as a subprocess.
"""
