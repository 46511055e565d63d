"""What a training step of the tiny policy really does, recorded from inside a run of the entry scripts (`sft.main`,
`rl.main`) by a trainer subclass that adds `StepProbe` as a callback: which vision activations require grad, which
trainable parameters got a gradient before each optimizer step, and which dropout calls were live while rollouts were
generated."""

from __future__ import annotations

import torch
from torch import nn
from transformers import TrainerCallback

from utils.trainable import VISION_TOWER


def _tensors(output) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, tuple | list):
        return [t for item in output for t in _tensors(item)]
    if isinstance(output, dict):
        return [t for item in output.values() for t in _tensors(item)]
    return [t for t in vars(output).values() if isinstance(t, torch.Tensor)] if hasattr(output, "__dict__") else []


class StepProbe(TrainerCallback):
    """Hooks the vision tower's modules and every dropout of `trainer.model`, and reads gradients before each
    optimizer step.

    - `vision_calls`: forward calls inside the vision tower; `vision_requiring_grad`: the modules among them whose
      output required grad (an activation kept for a backward pass through the tower).
    - `gradients`: one dict per optimizer step, trainable parameter name -> sum of |grad| (None: no grad).
    - `dropout_calls` / `live_dropout_calls`: dropout calls while the policy generated, and those that dropped
      something (the module in training mode with p > 0).
    """

    def __init__(self, trainer):
        self.vision_calls = 0
        self.vision_requiring_grad: set[str] = set()
        self.gradients: list[dict[str, float | None]] = []
        self.dropout_calls = self.live_dropout_calls = 0
        self.generating = False
        model = trainer.model
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        for name, module in base.named_modules():
            if name == VISION_TOWER or name.startswith(f"{VISION_TOWER}."):
                module.register_forward_hook(self._vision_hook(name))
            if isinstance(module, nn.Dropout):
                module.register_forward_pre_hook(self._dropout_hook)
        generate = base.generate

        def generating(*args, **kwargs):
            self.generating = True
            try:
                return generate(*args, **kwargs)
            finally:
                self.generating = False

        base.generate = generating
        trainer.add_callback(self)

    def _vision_hook(self, name: str):
        def hook(module, args, output):
            self.vision_calls += 1
            if any(t.requires_grad for t in _tensors(output)):
                self.vision_requiring_grad.add(name)

        return hook

    def _dropout_hook(self, module: nn.Dropout, args) -> None:
        if self.generating:
            self.dropout_calls += 1
            self.live_dropout_calls += int(module.training and module.p > 0)

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.gradients.append(
            {
                name: None if p.grad is None else float(p.grad.detach().abs().sum())
                for name, p in model.named_parameters()
                if p.requires_grad
            }
        )
