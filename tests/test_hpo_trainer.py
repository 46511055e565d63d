"""HPO in the trainer (`advantage_estimator: hpo | mapo+hpo`) and the variance diagnostics every estimator logs: steps
of a TRL rollout, their embeddings, per-token advantages on a tiny run with forced tool calls, online and offline
hindsight sets, fallbacks, and the gradient-variance probe."""

from types import SimpleNamespace

import pytest
import torch

import hpo.estimator
import hpo.transport
from data.synthetic import build_synthetic
from hpo import StepEncoder, normalize_step_advantages, online_group_step_advantages, step_segments, turn_index
from mapo_trainer import MAPOTrainer, kantorovich_potentials
from tests.tolerance import FLOAT64, approx, assert_close, tolerance, transformer_terms
from tiny.scripted import answer_turn, tiny_trainer, tool_call_turn


# ------------------------------------------------------------------------------------------------- pure pieces
def test_turns_are_the_runs_of_trained_tokens():
    completion_mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0, 0]])
    tool_mask = torch.tensor([[1, 1, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]])
    assert turn_index(completion_mask, tool_mask).tolist() == [
        [1, 1, -1, -1, 2, 2, 2, -1],  # turn, tool response, turn, padding
        [1, 1, 1, -1, -1, -1, -1, -1],
    ]


def test_segments_are_the_prompt_then_each_tool_response_and_turn(tiny_processor):
    tokenizer = tiny_processor.tokenizer
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")

    def ids(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    prompt = ids("<|im_start|>user\nWhere?<|im_end|>\n<|im_start|>assistant\n")
    turn1, tool, turn2 = (
        ids("<think>a</think>"),
        [*ids("<tool_response>"), pad, pad, *ids("x")],
        ids("<answer>A</answer>"),
    )
    completion = turn1 + tool + turn2
    mask = [1] * len(turn1) + [0] * len(tool) + [1] * len(turn2)
    (segments,) = step_segments(
        tokenizer,
        torch.tensor([[0, *prompt]]),
        torch.tensor([[0] + [1] * len(prompt)]),
        torch.tensor([completion + [0]]),
        torch.tensor([[1] * len(completion) + [0]]),
        torch.tensor([mask + [1]]),
        drop_token_ids=[pad],
    )
    assert segments == [
        "<|im_start|>user\nWhere?<|im_end|>\n<|im_start|>assistant\n",
        "<think>a</think>",
        "<tool_response>x<answer>A</answer>",  # the image pads are dropped before decoding
    ]


def test_a_step_embedding_is_the_encoder_on_its_prefix_alone(tiny_kit):
    """One forward pass per rollout reads every step, as if each prefix had been embedded on its own (causality),
    and a rollout longer than the window embeds each step from the window ending at it."""
    encoder = StepEncoder(str(tiny_kit["text_encoder"]))
    rollout = ["<|im_start|>user\nWhat colour?", "<think>zoom</think>", "<answer>red</answer>"]
    (together,) = encoder.embed([rollout])
    pieces = [encoder.tokenizer(s, add_special_tokens=False)["input_ids"] for s in rollout]
    with torch.no_grad():
        alone = [
            encoder.model(input_ids=torch.tensor([sum(pieces[: j + 1], [])])).last_hidden_state[0, -1]
            for j in range(3)
        ]
    assert together.shape == (3, encoder.width)
    # The same causal forward over a longer sequence: other reduction lengths (attention over the positions, blocked
    # matmuls), each step's hidden state within the encoder's chain of reductions, at the hidden states' size.
    forward = transformer_terms(64, 128, 2, len(sum(pieces, [])))
    size = float(together.abs().max())
    assert_close(together, torch.stack(alone), terms=forward, scale=size)
    short = StepEncoder(str(tiny_kit["text_encoder"]), max_length=6)
    (windowed,) = short.embed([rollout])
    gap = float((windowed[2] - together[2]).abs().max())
    assert torch.isfinite(windowed).all() and gap > tolerance(terms=forward, scale=size)["abs"]  # another context


def test_potentials_are_exported_where_the_trainer_lives():
    f, g, w1 = kantorovich_potentials(torch.tensor([[0.0], [2.0]]), torch.tensor([[1.0]]))
    assert float(w1) == approx(1.0, FLOAT64, terms=4)  # float64 LP on 3 points: a handful of roundings
    assert float(f @ torch.full((2,), 0.5, dtype=f.dtype) + g.sum()) == approx(1.0, FLOAT64, terms=8)


# --------------------------------------------------------------------------------------------- tiny training runs


@pytest.fixture(scope="module")
def rows():
    return build_synthetic(4, seed=0, split="train")


def run(tiny_kit, rows, tmp_path, **config):
    """A tiny run with forced calls: every rollout zooms once, then answers; even generation rows answer in format,
    odd rows skip <think> (`scripted.answer_turn`), so with `reward_funcs=[format]` each group of two has one success
    and one failure."""
    seen = []
    fields = dict(reward_funcs=["format"], max_steps=2, hpo_text_encoder=str(tiny_kit["text_encoder"])) | config
    trainer = tiny_trainer(MAPOTrainer, tiny_kit, rows, tmp_path, **fields)
    generate = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: seen.append(generate(inputs)) or seen[-1]
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    return trainer, seen, before


def logged(trainer, key):
    return [e[key] for e in trainer.state.log_history if key in e]


@pytest.mark.slow
def test_hpo_trains_with_per_token_advantages_that_differ_between_turns(tiny_kit, rows, tmp_path):
    trainer, batches, before = run(
        tiny_kit, rows, tmp_path, advantage_estimator="hpo", hpo_min_positive_steps=1, hpo_min_negative_steps=1
    )
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
    assert logged(trainer, "hpo/fallback_frac") == [0.0, 0.0]  # every group had a success and a failure
    a_e = list(trainer._logs["advantages"])[-4:]  # TRL keeps the last generation batch's episode advantages
    differing = 0
    for out in batches[-1:]:
        advantages, turns = out["advantages"], turn_index(out["completion_mask"], out["tool_mask"])
        assert advantages.shape == out["completion_ids"].shape and torch.isfinite(advantages).all()
        for row in range(advantages.shape[0]):
            per_turn = [advantages[row][turns[row] == t] for t in (1, 2)]
            assert all(v.numel() and torch.all(v == v[0]) for v in per_turn)  # one value per turn
            # A = (A_E + 0.5 A_S) / 1.5, so A_S = 3 A - 2 A_E. Online A_S is clipped to [-1, 1], then scaled by the
            # group's positive-step ratio: 3 of its 6 steps (two rollouts of 3) come from the successful rollout.
            step = [3 * v[0].item() - 2 * a_e[row] for v in per_turn]
            # 3 A - 2 A_E from float32 A (eq. 17, rounded once to float32) and A_E, both <= 1.5 in size
            slack = tolerance(terms=5, scale=1.5)["abs"]
            assert all(abs(a) <= 0.5 + slack for a in step)
            if per_turn[0][0] != per_turn[1][0]:
                differing += 1
            else:  # two turns alike only where both hit the same clip bound
                assert abs(step[0]) == approx(0.5, terms=5, scale=1.5), (row, step)
    assert differing > 0  # per-token advantages differ between the turns of a rollout
    table = list(trainer._logs["extra"]["turn_advantages"])
    assert len(table) == 4 and all(len(cell.split(" | ")) == 2 for cell in table)  # the last batch, per rollout


@pytest.mark.slow
@pytest.mark.parametrize(("fallback", "factor"), [("scaled", 1 / 1.5), ("unscaled", 1.0)])
def test_a_group_without_enough_steps_falls_back_to_the_episode_advantage(tiny_kit, rows, tmp_path, fallback, factor):
    """Authors' rule: >= 4 positive and >= 4 negative steps. Two rollouts of 3 steps never qualify: every group falls
    back, counted by reason, and its tokens carry GRPO's episode advantage, divided by 1 + omega as in the authors'
    code ('scaled', the default) or as it is ('unscaled')."""
    trainer, batches, _ = run(tiny_kit, rows, tmp_path, advantage_estimator="hpo", max_steps=1, hpo_fallback=fallback)
    assert logged(trainer, "hpo/fallback_frac") == [1.0]
    # one success and one failure of 3 steps each: too few of both
    assert (
        logged(trainer, "hpo/fallback/too_few_positive") == logged(trainer, "hpo/fallback/too_few_negative") == [1.0]
    )
    assert (
        logged(trainer, "hpo/fallback/nonfinite_embedding") == logged(trainer, "hpo/fallback/empty_hindsight") == [0]
    )
    (out,) = batches
    episode = torch.tensor(list(trainer._logs["advantages"])[-4:])
    assert torch.all(episode != 0)
    mask = (out["completion_mask"] * out["tool_mask"]).bool()
    for row in range(4):
        expected = (factor * episode[row]).expand(int(mask[row].sum()))
        assert_close(out["advantages"][row][mask[row]], expected, terms=2)  # x factor, in float64 then float32


@pytest.mark.slow
def test_unscorable_rows_take_no_part_in_hpo(tiny_kit, rows, tmp_path):
    """A row whose outcome rewards all returned None gets advantage 0 under 'mapo+hpo' and is in no cloud, no count and
    no statistic: groups [1, None], [1, 0], [None, None] are a fallback with too few negatives, an eligible group
    whose sigma is its own, and a group with nothing to score; only the middle one differs in outcome."""

    def flaky(completions, **kwargs):
        return [1.0, None, 1.0, 0.0, None, None][: len(completions)]

    trainer, batches, _ = run(
        tiny_kit, rows, tmp_path, reward_funcs=[flaky], advantage_estimator="mapo+hpo", max_steps=1,
        per_device_train_batch_size=6, hpo_min_positive_steps=1, hpo_min_negative_steps=1,
    )  # fmt: skip
    (out,) = batches
    for row in (1, 4, 5):
        assert torch.all(out["advantages"][row] == 0), row
    mask = (out["completion_mask"] * out["tool_mask"]).bool()
    assert torch.all(out["advantages"][2][mask[2]] > 0) and torch.all(out["advantages"][3][mask[3]] < 0)
    # counts over 3 groups, divided in float64 (then averaged over 1 step); the last one's mean taken in float32
    assert logged(trainer, "hpo/fallback_frac") == [approx(2 / 3, FLOAT64, terms=2)]
    assert logged(trainer, "hpo/fallback/no_scorable_rollout") == [approx(1 / 3, FLOAT64, terms=2)]
    assert logged(trainer, "hpo/fallback/too_few_negative") == [approx(1 / 3, FLOAT64, terms=2)]
    assert logged(trainer, "hpo/fallback/too_few_positive") == [0.0]
    assert logged(trainer, "mapo/frac_groups_outcome_all_equal") == [approx(2 / 3, terms=3)]
    # eq. 16's std is the middle group's alone, as if the unscorable rows had never been generated. Its steps are
    # embedded as the trainer embedded them, in one encoder pass over the batch's 6 rollouts (rows 2 and 3 taken):
    # the property is which steps enter the std, and embedding rows 2-3 alone pads and blocks the float32 forward
    # otherwise, which moved the std by 1.0e-6 relative on one CPU (issue 49) through transport and a std whose
    # condition has no useful bound. From the same float32 embeddings the rest is float64.
    pads = [trainer._image_pad_token_id]
    keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "tool_mask")
    segments = step_segments(trainer.processing_class.tokenizer, *(out[k] for k in keys), drop_token_ids=pads)
    steps = trainer.hpo.encoder.embed(segments)[2:4]
    group = online_group_step_advantages(
        torch.cat(steps),
        torch.cat([torch.full((len(s),), k) for k, s in enumerate(steps)]),
        torch.cat([torch.arange(len(s)) for s in steps]),
        [True, False],
        min_positive=1,
        min_negative=1,
    )
    batch = normalize_step_advantages([group])
    n = int(group.raw.numel())  # eq. 16's std (ddof 1) over the group's steps: mean, squares, sum, sqrt: ~3n roundings
    assert logged(trainer, "hpo/step_adv_sigma") == [approx(batch.sigma, FLOAT64, terms=3 * n)]
    table = list(trainer._logs["extra"]["turn_advantages"])[-6:]
    assert table[1] == table[4] == table[5] == "0.000 | 0.000"


@pytest.mark.slow
def test_offline_hindsight_from_a_dataset_column(tiny_kit, tmp_path):
    """Each row stores one successful trajectory as step texts; a stored embedding of the wrong width is refused
    with the column, row and both widths named."""
    success = [tool_call_turn("red circle"), answer_turn(0)]
    rows = build_synthetic(4, seed=0, split="train").add_column("hindsight", [[success]] * 4)
    trainer, batches, _ = run(
        tiny_kit, rows, tmp_path / "texts", advantage_estimator="hpo", hpo_hindsight="offline", max_steps=1
    )
    assert logged(trainer, "hpo/fallback_frac") == [0.0]
    assert torch.isfinite(batches[0]["advantages"]).all()
    wrong = build_synthetic(4, seed=0, split="train").add_column("hindsight", [[[[0.0, 1.0, 2.0]]]] * 4)
    with pytest.raises(ValueError, match=r"column 'hindsight', row 0: stored step embeddings have width 3"):
        run(tiny_kit, wrong, tmp_path / "wrong", advantage_estimator="hpo", hpo_hindsight="offline", max_steps=1)


@pytest.mark.slow
def test_mapo_plus_hpo_uses_mapos_composite_as_the_episode_advantage(tiny_kit, rows, tmp_path):
    """With omega = 0, eq. 17 is A_E itself: 'mapo+hpo' then trains on MAPO's advantages, token for token."""
    trainer, batches, _ = run(tiny_kit, rows, tmp_path, advantage_estimator="mapo+hpo", hpo_omega=0.0, max_steps=1)
    (out,) = batches
    episode = torch.tensor(list(trainer._logs["advantages"])[-4:])  # MAPO's composite (R_sem weighted 0.4)
    assert trainer.reward_weights[-1] == approx(0.4, terms=1)  # float32
    mask = (out["completion_mask"] * out["tool_mask"]).bool()
    for row in range(4):  # (A_E + 0 x A_S) / 1, in float64 from float32 and back: A_E itself
        assert torch.equal(out["advantages"][row][mask[row]], episode[row].expand(int(mask[row].sum())))


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["grpo", "mapo"])
def test_every_estimator_logs_its_advantage_variance_and_zero_fraction(tiny_kit, rows, tmp_path, estimator):
    trainer, batches, _ = run(tiny_kit, rows, tmp_path, advantage_estimator=estimator, max_steps=1)
    (out,) = batches
    mask = (out["completion_mask"] * out["tool_mask"]).bool()
    per_token = out["advantages"][:, None].expand_as(mask)[mask].double()
    (variance,), (zero,) = logged(trainer, "adv/variance"), logged(trainer, "adv/zero_frac")
    # Both in float64 from the same float32 advantages: sums of n values and squares (the logged one as E[x^2] -
    # E[x]^2, whose condition is E[x^2] / var), the check's two-pass var.
    n = per_token.numel()
    condition = float(per_token.square().mean() / per_token.var(correction=0))
    assert variance == approx(per_token.var(correction=0).item(), FLOAT64, terms=4 * n, condition=condition)
    assert zero == approx((per_token.abs() < 1e-8).double().mean().item(), FLOAT64, terms=2)


@pytest.mark.slow
def test_the_gradient_variance_probe_measures_without_changing_training(tiny_kit, rows, tmp_path):
    probed, _, _ = run(tiny_kit, rows, tmp_path / "probe", variance_probe_steps=1, variance_probe_rows=4)
    plain, _, _ = run(tiny_kit, rows, tmp_path / "plain")
    variances = logged(probed, "probe/grad_norm_var")
    assert len(variances) == 2 and all(v > 0 for v in variances)  # at steps 0 and 1, on the same fixed batch
    assert not logged(plain, "probe/grad_norm_var")
    plain_params = dict(plain.model.named_parameters())
    for name, param in probed.model.named_parameters():  # the probe takes gradients without touching the optimizer's
        assert torch.equal(param, plain_params[name]), name


def test_the_offline_embedding_cache_keeps_the_most_recently_used_prompts(tiny_kit, monkeypatch):
    monkeypatch.setattr(hpo.estimator, "OFFLINE_CACHE_PROMPTS", 2)
    config = SimpleNamespace(
        hpo_text_encoder=str(tiny_kit["text_encoder"]), hpo_encoder_max_length=64, hpo_hindsight_column="hindsight"
    )
    advantages = hpo.HPOAdvantages(config)
    trajectory = [[tool_call_turn("red circle"), answer_turn(0)]]
    for prompt in ("a", "b", "a", "c"):  # "b" is the least recently used when "c" arrives
        steps, n = advantages._offline_hindsight(trajectory, prompt, row=0)
        assert n == 1 and steps.shape[0] == 3  # the prompt and two steps
    assert [key.split("\x00")[0] for key in advantages._offline_embeddings] == ["a", "c"]


@pytest.mark.slow
def test_the_authors_solver_is_used_when_the_recipe_names_it(tiny_kit, rows, tmp_path, monkeypatch):
    solved = []
    potentials = hpo.transport.geomloss_potentials
    monkeypatch.setattr(hpo.transport, "geomloss_potentials", lambda x, y: solved.append(len(x)) or potentials(x, y))
    trainer, batches, _ = run(
        tiny_kit, rows, tmp_path, advantage_estimator="hpo", hpo_solver="geomloss", max_steps=1,
        hpo_min_positive_steps=1, hpo_min_negative_steps=1,
    )  # fmt: skip
    assert solved == [6, 6]  # both groups of the batch: 2 rollouts x (prompt + 2 turns)
    assert logged(trainer, "hpo/fallback_frac") == [0.0] and torch.isfinite(batches[0]["advantages"]).all()
