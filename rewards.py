"""Rewards a recipe picks by name (`reward_funcs: [gated_outcome]`), and the verifiers that score z_t
(`semantic_verifier: clip`).

Outcome and format rewards follow TRL's signature `(completions, **kwargs) -> list[float | None]` and are registered
in `REWARDS`; `None` marks a row its reward could not score (TRL and `MAPOTrainer` then give it advantage 0). The
semantic reward R_sem is not one of them: `MAPOTrainer` computes it from its verifier's scores of the calls each
rollout made (`mapo.semantic_reward`, eq. 2). Verifiers are registered in `VERIFIERS`: the paper's CLIP
(`ClipVerifier`, which evaluation scores with too), and controls for experiments on data with a known target
(`ExactVerifier`, its walk-only half `WalkVerifier`, and `ShuffledVerifier` of either). `judge_reward` scores open
answers with an LLM judge behind an OpenAI-compatible endpoint, as DeepEyes does.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import os
import re
import string
import urllib.request
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from data.task import (
    MAX_ANSWER_CHARS,
    USER_SUFFIX,
    extract_answer,
    final_text,
    is_correct,
    is_well_formed_turn,
    message_text,
)
from tools import ToolConfig, ZoomCall, box_contains, executed_calls
from utils.models import load_clip

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------ outcome and format
def outcome_reward(completions: list, answer: list[str], options: list[Sequence[str]] | None = None, **kwargs):
    """R_out: 1.0 when the final `<answer>` (fallback `\\boxed{}`) is correct, else 0.0. See `is_correct`."""
    options = options if options is not None else [()] * len(completions)
    return [float(is_correct(extract_answer(final_text(c)), a, o)) for c, a, o in zip(completions, answer, options)]


def format_reward(completions: list, **kwargs) -> list[float]:
    """1.0 when every assistant turn is `<think>...</think>` followed by a tool call (intermediate turns) or by one
    `<answer>...</answer>` (the last turn), else 0.0."""
    scores = []
    for completion in completions:
        if isinstance(completion, str):
            completion = [{"role": "assistant", "content": completion}]
        turns = [m for m in completion if m.get("role") == "assistant"]
        ok = bool(turns) and all(is_well_formed_turn(m, i == len(turns) - 1) for i, m in enumerate(turns))
        scores.append(float(ok))
    return scores


def gated_outcome_reward(completions: list, answer: list[str], options: list[Sequence[str]] | None = None, **kwargs):
    """Binary R_out with format as a gate: 1.0 when the answer is correct *and* every turn is well formed
    (`format_reward`), else 0.0. MAPO pairs R_sem with a binary outcome reward (section 3.3); gating keeps it binary
    while still refusing credit to a right answer in a broken format."""
    correct = outcome_reward(completions, answer, options)
    return [c * f for c, f in zip(correct, format_reward(completions))]


def tool_bonus_reward(
    completions: list, answer: list[str], environments: list, options: list[Sequence[str]] | None = None, **kwargs
):
    """DeepEyes' tool bonus: 1.0 when the answer is correct and at least one zoom-in call of the trained completion
    returned a crop (DeepEyes counts returned images; a call that only errored earns nothing), else 0.0."""
    correct = outcome_reward(completions, answer, options)
    used = [any(call.ok for call in executed_calls(env, c)) for env, c in zip(environments, completions)]
    return [c * float(u) for c, u in zip(correct, used)]


# The simulated reader: how often it reads the answer right, from a crop that frames the target and from anything else.
READER_HIT_P = 0.7
READER_MISS_P = 0.1
READER_MAX_AREA = 0.25  # a box over a quarter of the image is no zoom: the target stays as small as in the prompt


def frames_target(box: Sequence[int] | None, target_bbox: Sequence[int], image_size: tuple[int, int]) -> bool:
    """Whether a crop `box` (original pixels; None: no crop) frames the target: it holds the whole `target_bbox` and
    covers at most `READER_MAX_AREA` of the image, so zooming out to the whole image does not count."""
    if box is None:
        return False
    x1, y1, x2, y2 = box
    small = (x2 - x1) * (y2 - y1) <= READER_MAX_AREA * image_size[0] * image_size[1]
    return small and box_contains(box, target_bbox)


def target_in_view(call: ZoomCall, target_bbox: Sequence[int], image_size: tuple[int, int]) -> bool:
    """Whether a call returned a crop that `frames_target`."""
    return call.ok and frames_target(call.box, target_bbox, image_size)


def reader_draw(row_id: str, step: int, rollout: int) -> float:
    """The reader's uniform draw for one rollout, seeded by (row, training step, rollout index in the batch): the same
    rollout position at the same step of a rerun reads alike, and different rows, steps and rollouts independently."""
    seed = [zlib.crc32(str(row_id).encode()), int(step), int(rollout)]
    return float(np.random.default_rng(seed).random())


def _target_seen(completions: list, environments: list, target_bbox: list) -> list[bool]:
    return [
        any(target_in_view(call, target, env.image.size) for call in executed_calls(env, completion))
        for completion, env, target in zip(completions, environments, target_bbox)
    ]


def simulated_reader_reward(
    completions: list, environments: list, target_bbox: list, id: list, trainer_state=None, **kwargs
) -> list[float]:
    """A noisy outcome for experiments: a stand-in for a reader that answers right with probability `READER_HIT_P`
    when a valid zoom-in call framed the target (`target_in_view`) and `READER_MISS_P` otherwise, and only when every
    turn is well formed (`format_reward`). It never reads the answer: success is sparse and noisy the way a weak
    policy's is on a real benchmark, and depends only on where the policy looked. Needs the rows' `target_bbox` and
    `id` (the synthetic data has both). The draw is `reader_draw(id, global_step, position in the batch)`."""
    step = trainer_state.global_step if trainer_state is not None else 0
    seen = _target_seen(completions, environments, target_bbox)
    well_formed = format_reward(completions)
    return [
        ok * float(reader_draw(row_id, step, i) < (READER_HIT_P if hit else READER_MISS_P))
        for i, (ok, hit, row_id) in enumerate(zip(well_formed, seen, id))
    ]


def target_in_view_reward(completions: list, environments: list, target_bbox: list, **kwargs) -> list[float]:
    """The simulated reader without its noise, for positive controls: 1.0 when every turn is well formed and a valid
    zoom-in call framed the target (`target_in_view`), else 0.0."""
    seen = _target_seen(completions, environments, target_bbox)
    return [ok * float(hit) for ok, hit in zip(format_reward(completions), seen)]


# ------------------------------------------------------------------------------------------------------------ judge
# The judge's settings: environment variables read at each call (so a launcher can point a run at its endpoint without
# a recipe key), with their defaults. An empty value counts as unset.
JUDGE_ENV: dict[str, str] = {
    "JUDGE_BASE_URL": "http://localhost:8000/v1",  # OpenAI-compatible API root; POST {base}/chat/completions
    "JUDGE_MODEL": "judge",  # the served model name (`vllm serve <model> --served-model-name judge`)
    "JUDGE_API_KEY": "",  # sent as `Authorization: Bearer <key>` when set
    "JUDGE_TIMEOUT": "30",  # seconds per request; a request that takes longer leaves its row unscored
    "JUDGE_CONCURRENCY": "8",  # requests in flight at once for one batch
    "JUDGE_PROMPT": "",  # path to a text file with the prompt template; unset: JUDGE_TEMPLATE
}
JUDGE_PLACEHOLDERS = ("{question}", "{answer}", "{prediction}")
JUDGE_MAX_TOKENS = 16  # the reply is one word; a little room for punctuation or a trailing newline
JUDGE_TEMPLATE = """You are grading an answer to a question about an image. Decide whether the model's answer means \
the same as the ground-truth answer; ignore differences of wording, case, punctuation and formatting.

Question: {question}
Ground-truth answer: {answer}
Model's answer: {prediction}

Reply with exactly one word: CORRECT or INCORRECT."""


@dataclass(frozen=True)
class JudgeSettings:
    """The judge endpoint and how to ask it; see `JUDGE_ENV` and `judge_settings`."""

    base_url: str
    model: str
    api_key: str | None
    timeout: float
    concurrency: int
    template: str


def judge_settings(environ: Mapping[str, str]) -> JudgeSettings:
    """The `JudgeSettings` that `environ` (e.g. `os.environ`) gives, defaults from `JUDGE_ENV`. A bad value fails with
    a `ValueError` naming its variable: a base URL that is not http(s), a timeout that is not a positive number, a
    concurrency below 1, or a `JUDGE_PROMPT` file that does not exist or lacks `{answer}` or `{prediction}`."""
    env = {name: environ.get(name) or default for name, default in JUDGE_ENV.items()}
    base_url = env["JUDGE_BASE_URL"].rstrip("/")
    if not base_url.startswith(("http://", "https://")):
        raise ValueError(f"JUDGE_BASE_URL must be an http(s) URL, got {base_url!r}")
    try:
        timeout = float(env["JUDGE_TIMEOUT"])
    except ValueError:
        timeout = math.nan
    if not (math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"JUDGE_TIMEOUT must be a positive number of seconds, got {env['JUDGE_TIMEOUT']!r}")
    try:
        concurrency = int(env["JUDGE_CONCURRENCY"])
    except ValueError:
        concurrency = 0
    if concurrency < 1:
        raise ValueError(f"JUDGE_CONCURRENCY must be an integer of at least 1, got {env['JUDGE_CONCURRENCY']!r}")
    template = JUDGE_TEMPLATE
    if env["JUDGE_PROMPT"]:
        path = Path(env["JUDGE_PROMPT"])
        if not path.is_file():
            raise ValueError(f"JUDGE_PROMPT: no prompt template file at {str(path)!r}")
        template = path.read_text(encoding="utf-8")
        # Without the ground truth or the prediction the judge would grade nothing; the question is optional.
        missing = [p for p in JUDGE_PLACEHOLDERS[1:] if p not in template]
        if missing:
            raise ValueError(f"JUDGE_PROMPT: the template {str(path)!r} lacks the placeholder(s) {missing}")
    api_key = env["JUDGE_API_KEY"] or None
    return JudgeSettings(base_url, env["JUDGE_MODEL"], api_key, timeout, concurrency, template)


def parse_verdict(text: str) -> float | None:
    """The judge's reply as a score: 1.0 for CORRECT, 0.0 for INCORRECT (any case, surrounding whitespace and
    punctuation allowed, e.g. "**Correct.**"), None for anything else: empty, both words, a sentence, garbage."""
    word = text.strip(string.whitespace + string.punctuation).lower()
    return {"correct": 1.0, "incorrect": 0.0}.get(word)


_PLACEHOLDER_RE = re.compile(r"\{(question|answer|prediction)\}")


def fill_judge_prompt(template: str, question: str, answer: str, prediction: str) -> str:
    """`template` with its placeholders filled in one pass: other braces in the template stay as written (no
    `str.format`), and a placeholder inside a filled value (a prediction that writes "{answer}") is not expanded."""
    values = {"question": question, "answer": answer, "prediction": prediction}
    return _PLACEHOLDER_RE.sub(lambda m: values[m.group(1)], template)


def prompt_question(prompt: list[dict] | str | None) -> str:
    """The question a `prompt` row asks: its last user turn's text, less the format instruction (`USER_SUFFIX`), which
    is for the policy, not the judge; "" without a prompt."""
    if prompt is None or isinstance(prompt, str):
        return prompt or ""
    users = [m for m in prompt if m.get("role") == "user"]
    return message_text(users[-1]).removesuffix(USER_SUFFIX).strip() if users else ""


def ask_judge(settings: JudgeSettings, prompt: str) -> tuple[float | None, str | None]:
    """One chat request to the judge: (`parse_verdict` of its reply, None), or (None, why) when the request timed out,
    failed to connect, got an HTTP error or a malformed body, or the reply is no verdict. Never raises for these."""
    messages = [{"role": "user", "content": prompt}]
    body = {"model": settings.model, "messages": messages, "temperature": 0, "max_tokens": JUDGE_MAX_TOKENS}
    headers = {"Content-Type": "application/json"}
    if settings.api_key:
        headers["Authorization"] = f"Bearer {settings.api_key}"
    request = urllib.request.Request(
        f"{settings.base_url}/chat/completions", data=json.dumps(body).encode(), headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=settings.timeout) as response:
            content = json.load(response)["choices"][0]["message"]["content"]
    # OSError covers URLError, HTTPError and timeouts; ValueError a body that is not JSON; the rest a JSON body
    # without choices[0].message.content.
    except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError, TypeError) as error:
        return None, f"{type(error).__name__}: {error}"
    verdict = parse_verdict(content) if isinstance(content, str) else None
    return verdict, None if verdict is not None else f"no verdict in the reply {content!r}"


def judge_reward(completions: list, answer: list[str], prompts: list | None = None, **kwargs) -> list[float | None]:
    """R_out from an LLM judge, for open-ended answers: 1.0 when the judge says the final `<answer>` (fallback
    `\\boxed{}`) matches the row's `answer`, else 0.0.

    The judge is an OpenAI-compatible chat endpoint (e.g. `vllm serve <judge model> --served-model-name judge`), asked
    with the prompt template (`{question}`: the last user turn of the row's prompt, TRL's `prompts`; `{answer}`: the
    ground truth; `{prediction}`: the extracted answer) at temperature 0; it replies CORRECT or INCORRECT
    (`parse_verdict`). Settings, read from the environment at each call (`judge_settings`, `JUDGE_ENV`):
    `JUDGE_BASE_URL` (default http://localhost:8000/v1), `JUDGE_MODEL` (default judge), `JUDGE_API_KEY` (optional,
    sent as a Bearer token), `JUDGE_TIMEOUT` seconds (default 30), `JUDGE_CONCURRENCY` requests in flight (default 8),
    `JUDGE_PROMPT` (path to a template file; default `JUDGE_TEMPLATE`).

    A completion with no extractable answer scores 0.0, and so does an answer of `MAX_ANSWER_CHARS` (1000) characters
    or more (DeepEyes' rule against answer-spraying), both without a request. A row whose request times out, fails or
    gets no verdict is None (unscorable: advantage 0), with one warning a batch giving the count. Requests run
    concurrently; the scores are in row order.
    """
    settings = judge_settings(os.environ)
    prompts = prompts if prompts is not None else [None] * len(completions)
    predictions = [extract_answer(final_text(c)) for c in completions]
    asked = [i for i, p in enumerate(predictions) if p is not None and len(p) < MAX_ANSWER_CHARS]
    filled = [
        fill_judge_prompt(settings.template, prompt_question(prompts[i]), answer[i], predictions[i]) for i in asked
    ]
    scores: list[float | None] = [0.0] * len(completions)
    if not asked:
        return scores
    with ThreadPoolExecutor(max_workers=min(settings.concurrency, len(asked))) as pool:
        replies = list(pool.map(lambda p: ask_judge(settings, p), filled))
    for i, (verdict, _) in zip(asked, replies):
        scores[i] = verdict
    failures = [why for _, why in replies if why is not None]
    if failures:
        why = f"{len(failures)} of {len(asked)} requests to {settings.base_url} got no verdict (first: {failures[0]})"
        logger.warning("judge: %s; those rows are unscored", why)
    return scores


# --------------------------------------------------------------------------------------------------------- registry
REWARDS: dict[str, Callable[..., list[float | None]]] = {
    "outcome": outcome_reward,
    "format": format_reward,
    "gated_outcome": gated_outcome_reward,
    "tool_bonus": tool_bonus_reward,
    "simulated_reader": simulated_reader_reward,
    "target_in_view": target_in_view_reward,
    "judge": judge_reward,
}


# Dataset columns a reward or verifier reads besides TRL's own (`prompt`): checked before any model loads.
GROUND_TRUTH = ("target_bbox", "target_label")
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "outcome": ("answer",),
    "gated_outcome": ("answer",),
    "tool_bonus": ("answer",),
    "judge": ("answer",),
    "simulated_reader": ("target_bbox", "id"),
    "target_in_view": ("target_bbox",),
    "exact": GROUND_TRUTH,
    "shuffled_exact": GROUND_TRUTH,
    "exact_walk": ("target_bbox",),
    "shuffled_exact_walk": ("target_bbox",),
}


def check_columns(columns: Sequence[str], reward_names: Sequence[str], verifier: str, where: str) -> None:
    """Fail at start, naming the reward or verifier and the missing columns, when the dataset at `where` lacks a
    column one of them reads (`REQUIRED_COLUMNS`)."""
    readers = {f"reward {name}": name for name in reward_names} | {f"semantic_verifier {verifier}": verifier}
    missing = {
        reader: [c for c in REQUIRED_COLUMNS.get(name, ()) if c not in columns] for reader, name in readers.items()
    }
    missing = {reader: cols for reader, cols in missing.items() if cols}
    if missing:
        wants = "; ".join(f"{name} needs {cols}" for name, cols in missing.items())
        raise ValueError(f"{where}: {wants}, which the dataset lacks (its columns: {sorted(columns)})")


def get_reward_funcs(names: Sequence[str]) -> list[Callable]:
    """Reward functions by registry name; an unknown name fails with the list of known ones."""
    unknown = [n for n in names if n not in REWARDS]
    if unknown:
        raise ValueError(f"reward_funcs: unknown reward(s) {unknown}; known: {sorted(REWARDS)}")
    return [REWARDS[name] for name in names]


# --------------------------------------------------------------------------------------------------- verifier
class ClipVerifier:
    """Frozen open_clip model scoring (label, crop) pairs: z_t = cosine of the L2-normalised embeddings.

    It lives beside the policy, not inside it: never wrapped by DeepSpeed/accelerate, no gradients, eval mode,
    half precision on GPU. `similarity` scores a whole generation batch in one call. Built from a `ToolConfig`, so
    training and evaluation score with the same model and the same preprocessing: by default each crop is letterboxed
    to CLIP's square input (`clip_resize: pad`), since open_clip's default centre crop would score only the middle
    square of an elongated crop.
    """

    def __init__(self, config: ToolConfig, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.dtype = torch.float16 if self.device.type == "cuda" else torch.float32
        # Building the model draws its random init from the global RNG; fork it so adding the verifier does not
        # change the policy's sampling (MAPO with beta = 0 must reproduce GRPO on the same seed).
        with torch.random.fork_rng(devices=[]):
            self.model, self.preprocess, self.tokenizer = load_clip(
                config.clip_model, config.clip_pretrained, resize=config.clip_resize
            )
        self.model.to(device=self.device, dtype=self.dtype).eval().requires_grad_(False)

    @torch.no_grad()
    def similarity(self, labels: Sequence[str], images: Sequence[Image.Image]) -> torch.Tensor:
        """Cosine similarity of each label with its image, shape (N,), float32 on CPU."""
        if not labels:
            return torch.zeros(0)
        pixels = torch.stack([self.preprocess(image) for image in images]).to(self.device, self.dtype)
        tokens = self.tokenizer(list(labels)).to(self.device)
        image_emb = F.normalize(self.model.encode_image(pixels).float(), dim=-1)
        text_emb = F.normalize(self.model.encode_text(tokens).float(), dim=-1)
        return (image_emb * text_emb).sum(dim=-1).cpu()

    def score(self, calls: Sequence[ZoomCall], scenes: Sequence[Scene]) -> torch.Tensor:
        """z_t's raw cosine for valid `calls` (label against crop); the scenes are not read."""
        return self.similarity([call.label for call in calls], [call.crop for call in calls])


@dataclass(frozen=True)
class Scene:
    """What a verifier may know of a call's rollout besides the call: the whole image, and where the data has them,
    the target's box (original pixels) and its referent label: the ground truth the controls score from."""

    image: Image.Image
    target_bbox: Sequence[int] | None = None
    target_label: str | None = None

    def whole_image_call(self, call: ZoomCall) -> ZoomCall:
        """`call` as if it had zoomed on the whole image: what `semantic_score: contrastive` scores the label against
        to take away what the label earns anywhere."""
        return replace(call, crop=self.image, box=(0, 0, *self.image.size))


def normalise_label(label: str) -> str:
    """A label as the exact verifier compares it: lower case, punctuation dropped, a leading article dropped."""
    words = "".join(ch if ch.isalnum() else " " for ch in label.lower()).split()
    return " ".join(words[1:] if words and words[0] in ("the", "a", "an") else words)


class ExactVerifier:
    """A controlled upper bound for experiments, not a model: z_t = 1 when the label names the row's target (its
    `target_label`, compared by `normalise_label`) and the crop frames that target (`target_in_view`: the box holds
    it and is a zoom), else 0. It reads only the call's label and box and the scene's ground truth, never the answer.
    A label other than the target's scores 0 even if it names something else in the crop: the scene's ground truth
    is the target alone."""

    needs_ground_truth = True

    def score(self, calls: Sequence[ZoomCall], scenes: Sequence[Scene]) -> torch.Tensor:
        values = []
        for call, scene in zip(calls, scenes, strict=True):
            named = normalise_label(call.label) == normalise_label(scene.target_label or "")
            values.append(float(named and target_in_view(call, scene.target_bbox, scene.image.size)))
        return torch.tensor(values, dtype=torch.float32)


class WalkVerifier:
    """The walk half of `ExactVerifier`, a control for a policy that cannot yet name what it looks for: z_t = 1 when
    the call's crop frames the row's target (`target_in_view`), whatever the label says, else 0. It reads only the
    call's box and the scene's target box. It tells MAPO where the policy looked, not whether the label grounded, so
    an experiment that gains with it shows that the coupling uses an informative z_t, not that labels ground."""

    needs_ground_truth = True

    def score(self, calls: Sequence[ZoomCall], scenes: Sequence[Scene]) -> torch.Tensor:
        values = [float(target_in_view(c, s.target_bbox, s.image.size)) for c, s in zip(calls, scenes, strict=True)]
        return torch.tensor(values, dtype=torch.float32)


class ShuffledVerifier:
    """The information control: another verifier's scores, permuted across the calls of each scored batch. The
    batch holds the same z_t values (so the same advantage sizes) but a rollout's z_t no longer says anything about
    its own calls. The permutation is seeded by (seed, how many batches were scored), so a rerun repeats it."""

    def __init__(self, base, seed: int):
        self.base, self.seed, self.batches = base, seed, 0
        self.needs_ground_truth = getattr(base, "needs_ground_truth", False)

    def score(self, calls: Sequence[ZoomCall], scenes: Sequence[Scene]) -> torch.Tensor:
        values = self.base.score(calls, scenes)
        order = np.random.default_rng([self.seed, self.batches]).permutation(len(values))
        self.batches += 1
        return values[torch.from_numpy(order)]


# A verifier by the name a recipe gives (`semantic_verifier`): each built from the tool settings, a device and a seed.
VERIFIERS: dict[str, Callable[[ToolConfig, torch.device | str, int], object]] = {
    "clip": lambda config, device, seed: ClipVerifier(config, device=device),
    "exact": lambda config, device, seed: ExactVerifier(),
    "shuffled_exact": lambda config, device, seed: ShuffledVerifier(ExactVerifier(), seed),
    "exact_walk": lambda config, device, seed: WalkVerifier(),
    "shuffled_exact_walk": lambda config, device, seed: ShuffledVerifier(WalkVerifier(), seed),
}


def build_verifier(name: str, config: ToolConfig, device: torch.device | str = "cpu", seed: int = 0):
    """The verifier `name` from `VERIFIERS`; an unknown name fails with the list of known ones."""
    if name not in VERIFIERS:
        raise ValueError(f"semantic_verifier: unknown verifier {name!r}; known: {sorted(VERIFIERS)}")
    return VERIFIERS[name](config, device, seed)
