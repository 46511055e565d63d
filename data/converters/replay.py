"""One row's calls replayed against the images its release shows: images are indexed by what the release shows, not
by the calls, so a call after which it shows none failed upstream and is dropped (counted); otherwise the calls read
must match the images shown one for one, and each crop must agree with the one the release ships (`crop_check`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from data.converters.common import Box, SkipRow, content_images, content_text, listed, thought_of, to_image_box
from data.converters.crop_check import crop_disagreement
from data.converters.labels import call_label
from data.rows import Trajectory
from data.task import extract_answer


@dataclass
class ReadCall:
    """A call as read from a turn: the region of the original it crops, the dataset's label, and whether the release
    shows it as a matplotlib figure."""

    extent: Sequence[float]
    label: Any = None
    figure: bool = False


class Replay:
    """`images` holds every image the conversation has shown (the original first): its box in the original and its
    size as shown, what Mini-o3's `observation_i` and PixelReasoner's `target_image` index."""

    def __init__(self, original, shipped, store, question, tool, resize_step=1):
        self.original, self.shipped, self.store = original, list(shipped), store
        self.question, self.tool, self.resize_step = question, tool, resize_step
        self.images: list[tuple[Box, tuple[int, int]]] = [((0, 0, *original.size), original.size)]
        self.calls: list[dict] = []
        self.failed = self.checked = self.content = 0

    def turn(self, thought: str, read: Callable[[], list[ReadCall]], shown: int, code: bool = False) -> None:
        """One assistant turn: `read()` its calls, `shown` the images the release shows after it."""
        try:
            calls, error = read(), None
        except SkipRow as skip:
            calls, error = [], skip
        if shown == 0:  # the tool failed (or the code showed nothing): upstream added no image, nor do we
            self.failed += len(calls) or error is not None  # code that only computed is no failed call
            return
        if error is not None:
            raise error
        if not calls:
            what = "a code turn from which no crop was read" if code else "a turn with no call read"
            raise SkipRow("unread_code" if code else "image_count_mismatch", f"the release shows {shown} image(s) "
                          f"after {what}")  # fmt: skip
        if len(calls) != shown:
            raise SkipRow("image_count_mismatch", f"{len(calls)} crop(s) read, {shown} image(s) shown")
        for call in calls:
            box = to_image_box(call.extent, self.original.size)
            index = len(self.images)
            if index >= len(self.shipped):
                raise SkipRow("image_count_mismatch", f"image {index} shown but not shipped")
            shipped = self.store.open(self.shipped[index], f"image {index} (the crop of call {len(self.calls) + 1})")
            why, content = crop_disagreement(
                self.original, box, shipped, resize_step=self.resize_step, figure=call.figure
            )
            if why is not None:
                raise SkipRow("crop_mismatch", f"call {len(self.calls) + 1}, box {list(box)}: {why}")
            self.checked, self.content = self.checked + 1, self.content + content
            self.images.append((box, shipped.size))
            label, source = call_label(call.label, thought, self.question, self.tool)
            self.calls.append({"box": box, "thought": thought, "label": label, "label_source": source})

    def finish(self, row_id, source, options, final_text, final_thought) -> Trajectory:
        """The row as a `Trajectory`, its answer read from `final_text` (the last assistant turn) by the repo's one
        rule, `data.task.extract_answer`; a row without a question or an answer is a `SkipRow`."""
        if not self.question:
            raise SkipRow("empty_question")
        answer = extract_answer(final_text)
        if not answer:
            raise SkipRow("empty_answer")
        # the original's own file bytes go into the dataset: re-encoding a decoded 2000 x 1500 original as PNG cost
        # seconds a row and several times its size (docs/benchmarks.md, "Converting a release")
        encoded = self.store.encoded(self.shipped[0], "the original image")
        return Trajectory(str(row_id), source, self.original, self.question, answer, self.calls, final_thought,
                          list(options), self.checked, self.content, self.failed,
                          [size for _, size in self.images[1:]], encoded)  # fmt: skip


def shown_after(counts: Sequence[tuple[str, int]], position: int) -> int:
    """The images the user turns after message `position` show, up to the next assistant turn (`counts`: per message,
    its role and the images it shows)."""
    shown = 0
    for role, count in counts[position + 1 :]:
        if role == "assistant":
            break
        shown += count
    return shown


def question_images(counts: Sequence[tuple[str, int]], shipped: int) -> None:
    """The release shows the row's one original in the question and ships one image per image shown."""
    first = next((count for role, count in counts if role == "user"), 0)
    if first > 1:
        raise SkipRow("multi_image", f"the question shows {first} images")
    if first == 0:
        raise SkipRow("missing_image", "the question shows no image")
    total = sum(count for _, count in counts)
    if total != shipped:
        raise SkipRow("image_count_mismatch", f"the conversation shows {total} images, the row ships {shipped}")


def sharegpt_row(record, row_id, fmt, store, tool, question_of, turn_of, resize_step=1) -> Trajectory:
    """A `{messages: [{role, content}], images: [paths]}` row (LLaMA-Factory's sharegpt: CoF, DeepEyesV2), `images`
    the original then every image a user turn shows. `turn_of(text, replay)` reads an assistant turn: (its thought,
    the function reading its calls, whether it is code)."""
    images = listed(record, "images")
    if not images:
        raise SkipRow("missing_image", "no images")
    messages = listed(record, "messages", dict)
    counts = [(m.get("role"), content_images(m.get("content"))) for m in messages]
    question_images(counts, len(images))
    original = store.open(images[0], "images[0]")
    users = [content_text(m.get("content")) for m in messages if m.get("role") == "user"]
    question, options = question_of(users[0])
    replay = Replay(original, images, store, question, tool, resize_step)
    final = ""
    for position, message in enumerate(messages):
        if message.get("role") == "assistant":
            final = content_text(message.get("content"))
            thought, read, code = turn_of(final, replay)
            replay.turn(thought, read, shown_after(counts, position), code)
    return replay.finish(row_id, fmt.removesuffix("_sft"), options, final, thought_of(final))
