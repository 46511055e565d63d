"""The simulated reader in production (`rewards.simulated_reader`, a recipe's `simulated_reader`): its outcomes on
hand-made rollouts against draws worked out once by hand, its registration, and the research package's old import
path, which the experiments' recipes and logged metric key still use."""

from PIL import Image

from research import rewards as research_rewards
from rewards import REWARDS, RULE_REWARDS, get_reward_funcs
from rewards.simulated_reader import (
    READER_HIT_P,
    READER_MISS_P,
    reader_draw,
    reader_outcome,
    simulated_reader_reward,
)
from tools import ZoomCall
from utils.registry import required_columns

IMAGE = Image.new("RGB", (100, 200))  # 20,000 px: a zoom covers at most 5,000 of them
TARGET = [10, 10, 20, 20]
FRAMES, MISSES = (0, 0, 50, 50), (50, 50, 90, 90)  # a zoom that holds the target, one that does not


class Env:
    def __init__(self, *boxes):
        self.image = IMAGE
        self.calls = [ZoomCall(1, {}, "the star", box, IMAGE, None) for box in boxes]


def completion(calls: int, well_formed: bool = True) -> list[dict]:
    """`calls` assistant turns that call the zoom-in tool, each answered with a list-valued crop, then an answer turn
    (with its <think> and <answer> tags only when `well_formed`)."""
    messages = []
    for _ in range(calls):
        messages.append(
            {"role": "assistant", "content": "<think>x</think>", "tool_calls": [{"name": "image_zoom_in_tool"}]}
        )
        messages.append({"role": "tool", "name": "image_zoom_in_tool", "content": [{"type": "image"}]})
    messages.append({"role": "assistant", "content": "<think>y</think><answer>A</answer>" if well_formed else "A"})
    return messages


class State:
    global_step = 3


def test_the_reader_outcome_by_hand_and_with_common_random_numbers():
    # well formed, framed, draw under 0.7: right; missed, draw 0.09 under 0.1: right; framed but not well formed:
    # nothing; framed, draw 0.70 not under 0.7: wrong (the 30% of deserved looks it does not pay)
    well, seen, draws = [1.0, 1.0, 0.0, 1.0], [True, False, True, True], [0.69, 0.09, 0.0, 0.70]
    assert READER_HIT_P == 0.7 and READER_MISS_P == 0.1
    assert reader_outcome(well, seen, draws) == [1.0, 1.0, 0.0, 0.0]
    # the same draws read by a reader right half the time on a framed crop: only the draws under 0.5 change
    assert reader_outcome(well, seen, draws, hit_p=0.5) == [0.0, 1.0, 0.0, 0.0]


def test_the_reward_pays_by_where_the_policy_looked_with_draws_per_row_step_and_rollout():
    """Draws at step 3, worked out once (`reader_draw`): row-c at rollouts 0 and 1 0.6444 and 0.3283, row-b at 2
    0.8019, row-a at 3 0.4859; row-b at 0 0.0879."""
    assert [round(reader_draw(r, 3, i), 4) for i, r in enumerate(["row-c", "row-c", "row-b", "row-a"])] == [
        0.6444,
        0.3283,
        0.8019,
        0.4859,
    ]
    envs = [Env(FRAMES), Env(MISSES), Env(FRAMES), Env(FRAMES)]
    completions = [completion(1), completion(1), completion(1), completion(1, well_formed=False)]
    ids = ["row-c", "row-c", "row-b", "row-a"]
    # framed 0.6444 < 0.7: 1; missed 0.3283 >= 0.1: 0; framed 0.8019 >= 0.7: 0; framed 0.4859 but no answer tags: 0
    assert simulated_reader_reward(completions, envs, [TARGET] * 4, ids, trainer_state=State()) == [1.0, 0.0, 0.0, 0.0]
    # A miss still reads right now and then: row-b's draw 0.0879 at rollout 0 is under 0.1.
    assert simulated_reader_reward([completion(1)], [Env(MISSES)], [TARGET], ["row-b"], trainer_state=State()) == [1.0]
    # Without a trainer state the draws are step 0's: row-c at rollout 0 is 0.8939, over 0.7.
    assert simulated_reader_reward([completion(1)], [Env(FRAMES)], [TARGET], ["row-c"]) == [0.0]
    # No call, or a row without a target box, is a miss, read right at 0.1: row-b 0.0879 yes, row-c 0.6444 no.
    assert simulated_reader_reward([completion(0)], [Env()], [TARGET], ["row-b"], trainer_state=State()) == [1.0]
    assert simulated_reader_reward([completion(1)], [Env(FRAMES)], [None], ["row-c"], trainer_state=State()) == [0.0]


def test_the_reader_is_registered_by_name_and_kept_under_its_research_path():
    assert get_reward_funcs(["simulated_reader"]) == [simulated_reader_reward] and "simulated_reader" in REWARDS
    assert "simulated_reader" in RULE_REWARDS  # it never reads the answer: no judge behind it
    assert required_columns(simulated_reader_reward) == ("target_bbox", "id")
    # The experiments' recipes name it by its old import path, and their logged key is rewards/<__name__>/mean.
    assert get_reward_funcs(["research.rewards:simulated_reader_reward"]) == [simulated_reader_reward]
    assert simulated_reader_reward.__name__ == "simulated_reader_reward"
    assert research_rewards.reader_draw is reader_draw and research_rewards.READER_HIT_P == READER_HIT_P
