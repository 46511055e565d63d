"""A TRL rollout's steps as HPO reads them (section 4.1: a step is an assistant turn, step 0 the prompt): each token's
turn, each step's text, and the frozen text encoder that embeds them (the intent space of section 4.2)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import torch

from utils.models import load_text_encoder


def turn_index(completion_mask: torch.Tensor, tool_mask: torch.Tensor | None) -> torch.Tensor:
    """(B, T) step of each completion token: j >= 1 for assistant turn j (the j-th run of tokens with
    `completion_mask * tool_mask` = 1), -1 for tool-response tokens and padding."""
    kept = completion_mask.bool() if tool_mask is None else (completion_mask * tool_mask).bool()
    starts = kept & ~torch.nn.functional.pad(kept, (1, 0))[:, :-1]
    index = torch.cumsum(starts.long(), dim=1)
    return torch.where(kept, index, torch.full_like(index, -1))


def step_segments(
    tokenizer,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    tool_mask: torch.Tensor | None,
    drop_token_ids: Sequence[int] = (),
) -> list[list[str]]:
    """Per row, `[prompt, segment 1, ..., segment T]`: segment j is the tool response to turn j - 1 (if any), then
    turn j. Segments 0..j are the history up to step j plus its action, the state-action pair HPO embeds (section 4.2;
    the authors' code also appends the observation that follows, here an image the text encoder cannot read).
    `drop_token_ids` (the image pads, noise to a text encoder) are removed before decoding.
    """
    drop = torch.tensor(list(drop_token_ids), dtype=prompt_ids.dtype, device=prompt_ids.device)
    turns = turn_index(completion_mask, tool_mask)
    rows = []
    for b in range(prompt_ids.shape[0]):

        def text(ids: torch.Tensor) -> str:
            return tokenizer.decode(ids[~torch.isin(ids, drop)].tolist(), skip_special_tokens=False)

        segments = [text(prompt_ids[b][prompt_mask[b].bool()])]
        ends = [int(t) for t in (turns[b][:-1] != turns[b][1:]).nonzero().flatten() if turns[b][t] > 0]
        if turns[b].numel() and turns[b][-1] > 0:
            ends.append(turns[b].numel() - 1)
        start = 0
        for end in ends:
            segments.append(text(completion_ids[b][start : end + 1]))
            start = end + 1
        rows.append(segments)
    return rows


class StepEncoder:
    """A frozen causal text encoder (`hpo_text_encoder`) beside the policy, like the CLIP verifier. One forward pass
    over a rollout's concatenated segments embeds every step: step j is the last hidden state at the last token of
    segments 0..j (the authors' code; no L2 normalisation). Past `max_length` tokens, each step is embedded from its
    own window, the last `max_length` tokens up to its end.
    """

    def __init__(self, name: str, device: torch.device | str = "cpu", max_length: int = 8192, batch_size: int = 16):
        self.device = torch.device(device)
        with torch.random.fork_rng(devices=[]):  # loading must not move the policy's sampling RNG
            self.model, self.tokenizer = load_text_encoder(name)
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.model.to(device=self.device, dtype=dtype)
        self.max_length, self.batch_size = max_length, batch_size
        self.width = self.model.config.hidden_size

    @torch.no_grad()
    def embed(self, rollouts: Sequence[Sequence[str]]) -> list[torch.Tensor]:
        """Per rollout, a (steps, width) float32 CPU tensor: one row per segment prefix."""
        windows, owners = [], []  # token ids to run, and (rollout, step) of each position read from them
        for r, segments in enumerate(rollouts):
            pieces = [self.tokenizer(s, add_special_tokens=False)["input_ids"] for s in segments]
            ids = [token for piece in pieces for token in piece]
            ends = list(accumulate(max(len(p), 0) for p in pieces))
            ends = [max(e, 1) - 1 for e in ends]  # an empty first segment still reads position 0
            if len(ids) <= self.max_length:
                windows.append(ids or [self.tokenizer.pad_token_id or 0])
                owners.append([(r, s, e) for s, e in enumerate(ends)])
            else:
                for s, e in enumerate(ends):
                    lo = max(0, e + 1 - self.max_length)
                    windows.append(ids[lo : e + 1])
                    owners.append([(r, s, e - lo)])
        out = [torch.empty(len(segments), self.width) for segments in rollouts]
        order = sorted(range(len(windows)), key=lambda i: len(windows[i]))  # similar lengths batch with less padding
        pad = self.tokenizer.pad_token_id or 0
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            width = max(len(windows[i]) for i in chunk)
            ids = torch.tensor([windows[i] + [pad] * (width - len(windows[i])) for i in chunk], device=self.device)
            mask = torch.tensor([[1] * len(windows[i]) + [0] * (width - len(windows[i])) for i in chunk])
            hidden = self.model(input_ids=ids, attention_mask=mask.to(self.device)).last_hidden_state.float().cpu()
            for row, i in enumerate(chunk):
                for r, s, position in owners[i]:
                    out[r][s] = hidden[row, position]
        return out
