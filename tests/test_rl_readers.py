"""RL training-set readers beside DeepEyes-47k: Mini-o3's JSON lists and Chain-of-Focus' RL parquet.

The real files cannot be downloaded here, so each fixture rebuilds the published layout, as the projects' own code
reads and writes it (Mini-o3's `multimodal_dataset.py`, github.com/Mini-o3/Mini-o3, joins `images` to BASE_IMAGE_DIR;
CoF's `verl/recipe/zoomin/data_progress/prepare_zoomin_data.py`, github.com/xtong-zhang/Chain-of-Focus, writes the
parquet), with tiny PNGs whose sizes differ per row, so a test can tell which image a row loaded.
"""

import io
import json
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from data import DATASETS, convert, get_dataset, load_split
from data.benchmarks import BENCHMARKS, BadRowError, load_benchmark, read_benchmark
from data.task import SYSTEM_PROMPT, USER_SUFFIX, build_prompt
from tests import release_fixtures
from tests.release_fixtures import cof_record, cof_user_turn, mini_o3_row, write_mini_o3
from tools import ToolConfig

# CoF's own system turn carries its tool schema; the reader must replace it with ours, as DeepEyes' is replaced
COF_SYSTEM = (
    "You are a helpful assistant.\n\n# Tools\n<tools>\n"
    '{"type": "function", "function": {"name": "image_zoom_in_tool"}}\n</tools>'
)
COF_USER_SUFFIX = (
    "\nThink in the mind first, and then decide whether to call tools one or more times OR provide final answer."
)


def png(path, size, colour=(200, 30, 30)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path, format="PNG")
    return path


def png_bytes(size):
    buffer = io.BytesIO()
    Image.new("RGB", size, (30, 200, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


def sizes(dataset):
    return [dataset[i]["image"].size for i in range(len(dataset))]


# ------------------------------------------------------------------------------------------------------ fixtures
def mini_o3_records():
    return [
        {  # written relative to BASE_IMAGE_DIR, as Mini-o3's loader joins them: resolved via the JSON folder's parent
            "images": ["VisualProbe_train/images/0.png"],
            "doc_id": 11,
            "problem": "<image>\nWhat is written on the small sign?",
            "solution": "STOP",
            "data_source": "visual_probe",
        },
        {  # written relative to the JSON's own folder
            "images": ["images/1.png"],
            "doc_id": "vp-2",
            "problem": "<image>\n  How many cups are on the table?  \n",
            "solution": "3",
            "data_source": "visual_probe",
        },
        {  # no doc_id; options embedded V*-style, so the answer is a letter
            "images": ["images/2.png"],
            "problem": "<image>\nWhat colour is the car?\n(A) red\n(B) blue\n"
            "Answer with the option's letter from the given choices directly.",
            "solution": "B",
            "data_source": "deepeyes_4k",
        },
    ]


@pytest.fixture
def mini_o3_json(tmp_path):
    """Mini-o3 RL data: BASE_IMAGE_DIR/VisualProbe_train/train.json, a JSON list, images beside it."""
    folder = tmp_path / "base" / "VisualProbe_train"
    for i in range(3):
        png(folder / "images" / f"{i}.png", (40 + 10 * i, 30))
    (folder / "train.json").write_text(json.dumps(mini_o3_records()))
    return folder / "train.json"


COF_QUESTIONS = [
    ("What is the color of the umbrella?", "red", []),
    ("Is the dog left or right of the cat?", "A", ["left", "right"]),
    ("What is written on the flag?", "peace", []),
]


def cof_rows(images):
    """CoF RL rows (prepare_zoomin_data.py's layout): only the first has extra_info.question; the others' questions
    are read from the user turn, one multiple choice and one open."""
    rows = []
    for i, ((question, truth, options), image) in enumerate(zip(COF_QUESTIONS, images)):
        text = question + "".join(f"\n({chr(65 + j)}) {option}" for j, option in enumerate(options))
        if options:
            instruction = "Answer with the option's letter from the given choices directly."
        else:
            instruction = "Answer the question using a single word or phrase."
        rows.append(
            {
                "data_source": "cof_vstar",
                "agent_name": "tool_agent",
                "prompt": [
                    {"role": "system", "content": COF_SYSTEM},
                    {"role": "user", "content": f"<image> Question: {text}\n{instruction}{COF_USER_SUFFIX}"},
                ],
                "images": [image],
                "ability": "vision",
                "reward_model": {"style": "rule", "ground_truth": truth},
                "extra_info": {"split": "train", "index": i, "answer": truth, "question": text if i == 0 else None},
            }
        )
    return rows


COF_ENCODINGS = ("relative_path", "file_url", "bytes", "struct", "nested_struct")


def write_cof(root, encoding):
    """train.parquet + images/ in `root`, each row's image in `encoding` (a parquet column holds one type)."""
    root.mkdir(parents=True, exist_ok=True)
    images = []
    for i, size in enumerate([(64, 48), (72, 48), (80, 48)]):
        if encoding == "relative_path":  # the released layout: images.zip unzipped beside train.parquet
            png(root / "images" / f"{i}.png", size)
            images.append({"image": f"images/{i}.png"})
        elif encoding == "file_url":  # what prepare_zoomin_data.py writes: an absolute file:// URL
            images.append({"image": f"file://{png(root / 'images' / f'{i}.png', size)}"})
        elif encoding == "bytes":
            images.append({"image": png_bytes(size)})
        elif encoding == "struct":  # an HF image struct, as DeepEyes' images are
            images.append({"bytes": png_bytes(size), "path": None})
        else:
            images.append({"image": {"bytes": png_bytes(size), "path": None}})
    path = root / "train.parquet"
    pq.write_table(pa.Table.from_pylist(cof_rows(images)), path)
    return path


@pytest.fixture
def cof_parquet(tmp_path):
    return write_cof(tmp_path / "cof", "relative_path")


def deepeyes_parquet(tmp_path, question):
    """A one-row DeepEyes-47k parquet, to compare prompts with the reader the RL trainer already uses."""
    row = {
        "data_source": "vstar",
        "prompt": [{"role": "system", "content": COF_SYSTEM}, {"role": "user", "content": f"<image>\n{question}"}],
        "images": [{"bytes": png_bytes((64, 48)), "path": None}],
        "reward_model": {"ground_truth": "x", "style": "model"},
        "extra_info": {"question": f"<image>\n{question}"},
    }
    path = tmp_path / "deepeyes.parquet"
    pq.write_table(pa.Table.from_pylist([row]), path)
    return path


# ------------------------------------------------------------------------------------------------------- mini-o3
def test_mini_o3(mini_o3_json):
    dataset = load_benchmark("mini_o3", mini_o3_json)
    assert len(dataset) == 3
    assert dataset["id"] == ["11", "vp-2", "train-2"]  # doc_id, else <file stem>-<row>
    assert dataset[0]["prompt"] == build_prompt("What is written on the small sign?")  # "<image>\n" stripped
    assert dataset[1]["prompt"] == build_prompt("How many cups are on the table?")  # and the whitespace around it
    assert dataset[2]["prompt"] == build_prompt("What colour is the car?", ["red", "blue"])
    assert dataset["answer"] == ["STOP", "3", "B"] and dataset["options"] == [[], [], ["red", "blue"]]
    assert dataset["source"] == ["mini_o3/visual_probe", "mini_o3/visual_probe", "mini_o3/deepeyes_4k"]
    assert sizes(dataset) == [(40, 30), (50, 30), (60, 30)]  # each row loaded its own image


def test_mini_o3_image_base_rule(mini_o3_json):
    """A relative path resolves against the JSON's folder first, then its parent; a folder holding train.json reads
    the same as the file."""
    assert load_benchmark("mini_o3", mini_o3_json.parent)["id"] == ["11", "vp-2", "train-2"]
    records = mini_o3_records()
    records[0]["images"] = ["shadow.png"]  # in both folders: the JSON's own wins
    png(mini_o3_json.parent / "shadow.png", (70, 30))
    png(mini_o3_json.parent.parent / "shadow.png", (90, 30))
    mini_o3_json.write_text(json.dumps(records))
    assert sizes(load_benchmark("mini_o3", mini_o3_json))[0] == (70, 30)


def test_mini_o3_needs_a_json_list(tmp_path):
    (tmp_path / "train.json").write_text(json.dumps({"images": []}))
    with pytest.raises(ValueError, match="JSON list"):
        load_benchmark("mini_o3", tmp_path)
    with pytest.raises(FileNotFoundError, match="train.json"):
        load_benchmark("mini_o3", tmp_path / "missing")


# ------------------------------------------------------------------------------------------------ chain-of-focus
@pytest.mark.parametrize("encoding", COF_ENCODINGS)
def test_cof_rl(encoding, tmp_path):
    dataset = load_benchmark("cof_rl", write_cof(tmp_path / "cof", encoding))
    assert dataset["id"] == ["train-0", "train-1", "train-2"] and dataset["source"] == ["cof/cof_vstar"] * 3
    assert dataset[0]["prompt"] == build_prompt("What is the color of the umbrella?")  # from extra_info.question
    # no extra_info.question: the user turn, less "<image> Question:" and CoF's answer and tool instructions
    assert dataset[1]["prompt"] == build_prompt("Is the dog left or right of the cat?", ["left", "right"])
    assert dataset[2]["prompt"] == build_prompt("What is written on the flag?")
    assert dataset["answer"] == ["red", "A", "peace"] and dataset["options"] == [[], ["left", "right"], []]
    assert sizes(dataset) == [(64, 48), (72, 48), (80, 48)]


# ---------------------------------------------------------------------------------------------------- both readers
@pytest.mark.parametrize("name", ["mini_o3", "cof_rl"])
def test_prompt_is_the_deepeyes_readers_prompt(name, mini_o3_json, cof_parquet, tmp_path):
    """The RL trainer gets our system prompt and user suffix (the tool schema comes from the chat template's
    `tools=`), exactly as for DeepEyes; the set's own system prompt and tool schema are dropped."""
    dataset = load_benchmark(name, {"mini_o3": mini_o3_json, "cof_rl": cof_parquet}[name])
    question = {"mini_o3": "What is written on the small sign?", "cof_rl": "What is the color of the umbrella?"}[name]
    prompt = dataset[0]["prompt"]
    assert prompt == load_benchmark("deepeyes", deepeyes_parquet(tmp_path, question))[0]["prompt"]
    assert [m["role"] for m in prompt] == ["system", "user"] and prompt[0]["content"] == SYSTEM_PROMPT
    assert prompt[1]["content"].endswith(USER_SUFFIX)
    assert not any("<image>" in m["content"] or "<tools>" in m["content"] for row in dataset["prompt"] for m in row)


def test_registered_for_the_rl_entry(mini_o3_json, cof_parquet):
    """data.load_split calls get_dataset(name, path=..., split=...) for every non-synthetic dataset name."""
    assert {"mini_o3", "cof_rl"} <= set(DATASETS) and {"mini_o3", "cof_rl"} <= set(BENCHMARKS)
    assert len(get_dataset("mini_o3", path=str(mini_o3_json), split="train")) == 3
    assert len(get_dataset("cof_rl", path=str(cof_parquet), split="train", skip_bad_rows=False)) == 3
    recipe = SimpleNamespace(dataset_name="mini_o3", dataset_path=str(mini_o3_json))
    assert load_split(recipe, "train")["id"] == ["11", "vp-2", "train-2"]


# -------------------------------------------------------------------------------------------------------- bad rows
def break_mini_o3_image(file):
    (file.parent / "images" / "1.png").unlink()
    return "mini_o3", file, 1, "images[0]", "image file not found: images/1.png"


def break_mini_o3_answer(file):
    records = mini_o3_records()
    records[2]["solution"] = "  "
    file.write_text(json.dumps(records))
    return "mini_o3", file, 2, "solution", "missing"


def break_mini_o3_problem(file):
    records = mini_o3_records()
    del records[0]["problem"]
    file.write_text(json.dumps(records))
    return "mini_o3", file, 0, "problem", "missing"


def break_cof_image(file):
    (file.parent / "images" / "0.png").unlink()
    return "cof_rl", file, 0, "images[0].image", "image file not found"


def break_cof_truth(file):
    rows = pq.read_table(file).to_pylist()
    rows[1]["reward_model"]["ground_truth"] = ""
    pq.write_table(pa.Table.from_pylist(rows), file)
    return "cof_rl", file, 1, "reward_model.ground_truth", "missing"


def break_cof_question(file):
    rows = pq.read_table(file).to_pylist()
    rows[1]["prompt"] = [rows[1]["prompt"][0]]  # no user turn, and no extra_info.question to fall back on
    pq.write_table(pa.Table.from_pylist(rows), file)
    return "cof_rl", file, 1, "prompt", "missing"


@pytest.mark.parametrize(
    ("fixture", "breaker", "usable"),
    [
        ("mini_o3_json", break_mini_o3_image, 2),
        ("mini_o3_json", break_mini_o3_answer, 2),
        ("mini_o3_json", break_mini_o3_problem, 2),
        ("cof_parquet", break_cof_image, 2),
        ("cof_parquet", break_cof_truth, 2),
        ("cof_parquet", break_cof_question, 2),
    ],
)
def test_bad_row_names_file_row_and_field_or_is_skipped(fixture, breaker, usable, request):
    name, file, row, field, reason = breaker(request.getfixturevalue(fixture))
    with pytest.raises(BadRowError) as caught:
        load_benchmark(name, file)
    error = caught.value
    assert (error.file, error.row, error.field) == (str(file), row, field)
    assert (
        reason in str(error) and str(file) in str(error) and f"row {row}" in str(error) and repr(field) in str(error)
    )

    dataset, skipped = read_benchmark(name, file, skip_bad_rows=True)
    assert [(bad.row, bad.field) for bad in skipped] == [(row, field)]
    assert len(dataset) == usable


def test_missing_column_is_a_bad_row_of_every_row(cof_parquet):
    pq.write_table(pq.read_table(cof_parquet).drop_columns(["reward_model"]), cof_parquet)
    with pytest.raises(BadRowError) as caught:
        load_benchmark("cof_rl", cof_parquet)
    assert (caught.value.row, caught.value.field) == (0, "reward_model.ground_truth")
    with pytest.raises(ValueError, match=r"no usable cof_rl rows \(3 skipped\)"):
        read_benchmark("cof_rl", cof_parquet, skip_bad_rows=True)


# ------------------------------------------------------------------------------------------- the same words as SFT
SFT_RL_QUESTIONS = [
    ("What colour is the small square?", []),
    ("Is the red square left or right of the bar?", ["left", "right"]),
]


@pytest.mark.parametrize(("question", "options"), SFT_RL_QUESTIONS)
@pytest.mark.parametrize("field", ["extra_info.question", "prompt"])
def test_cof_sft_and_rl_ask_the_same_question(tmp_path, question, options, field):
    """Issue 29, defect 7: the `cof_sft` converter and the `cof_rl` reader give one CoF question the same prompt and
    options (the SFT reader used to keep CoF's options block and its "Think in the mind first" line). Both user turns
    are CoF's (`prepare_zoomin_data.py`: "<image> Question: ..." + an answer instruction + its tool instruction)."""
    record, files = cof_record([([240, 90, 300, 150], "the red square")], question=question, options=options,
                               answer="A" if options else "red")  # fmt: skip
    sft_release = release_fixtures.write_cof(tmp_path / "sft", [(record, files)])
    sft_rows, _ = convert.convert("cof_sft", sft_release, ToolConfig())
    rl_row = {
        "data_source": "cof", "prompt": [{"role": "system", "content": COF_SYSTEM},
                                         {"role": "user", "content": cof_user_turn(question, options)}],
        "images": [{"image": png_bytes((64, 48))}], "reward_model": {"ground_truth": "A" if options else "red"},
        "extra_info": {"question": question + "".join(f"\n({chr(65 + j)}) {o}" for j, o in enumerate(options))
                       if field == "extra_info.question" else None},
    }  # fmt: skip
    pq.write_table(pa.Table.from_pylist([rl_row]), tmp_path / "train.parquet")
    rl = load_benchmark("cof_rl", tmp_path / "train.parquet")
    (sft_row,) = [convert.as_row(t) for t in sft_rows]
    assert sft_row["prompt"] == rl[0]["prompt"] == build_prompt(question, options)
    assert sft_row["options"] == rl[0]["options"] == options


@pytest.mark.parametrize(("question", "options"), SFT_RL_QUESTIONS)
def test_mini_o3_cold_start_and_rl_ask_the_same_question(tmp_path, question, options):
    """Mini-o3's cold-start human turn and its RL `problem` are the same text ("<image>\\n" + the question, V*-style
    options and instruction after it): one question, one prompt, for SFT and RL."""
    text = question + "".join(f"\n({chr(65 + j)}) {o}" for j, o in enumerate(options))
    if options:
        text += "\nAnswer with the option's letter from the given choices directly."
    answer = "A" if options else "red"
    sft_rows, _ = convert.convert("mini_o3_coldstart", write_mini_o3(tmp_path / "sft", [mini_o3_row(
        [{"bbox_2d": [0.5, 0.2, 0.8, 0.6], "source": "original_image"}], question=text, answer=answer)]), ToolConfig())  # fmt: skip
    folder = tmp_path / "rl" / "VisualProbe_train"
    png(folder / "images" / "0.png", (40, 30))
    record = {"images": ["images/0.png"], "doc_id": 1, "problem": f"<image>\n{text}", "solution": answer}
    (folder / "train.json").write_text(json.dumps([record]))
    rl = load_benchmark("mini_o3", folder / "train.json")
    (sft_row,) = [convert.as_row(t) for t in sft_rows]
    assert sft_row["prompt"] == rl[0]["prompt"] == build_prompt(question, options)
