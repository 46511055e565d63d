"""The recipe dataclasses of the stages other than RL (`sft`, `evaluation`); `configs` is the index of them all."""
