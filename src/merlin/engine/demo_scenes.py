"""Pictures of shapes and the questions about them that the shipped demo model is trained on.

One module serves three users: the training script (scripts/train_demo.py, in a torch venv),
the evaluation (`python -m merlin.engine.bench demo-quality`) and the tests, which draw
pictures, ask through the CLI or the GUI and compare with `answer()`. It needs only Pillow and
NumPy, so the evaluation and the tests run without torch.

A scene is one to four shapes, each of a different kind and a different colour, each in its
own region (top, left, middle, right, bottom), small or big, on a plain or gradient neutral
background, with some pixel noise and sometimes JPEG artefacts. Every fact the questions ask
about is unambiguous by construction: the kinds and colours are distinct, the regions do not
overlap, "which is bigger" is only asked about a small and a big shape. Lists and descriptions
name the shapes in reading order (top, left, middle, right, bottom), so each picture has exactly
one right answer per question and exact-match accuracy is meaningful.

Everything is seeded: `scene(seed)` and `question(scene, kind, lang, seed)` are pure functions
of their arguments (Python's `random.Random`, Pillow and NumPy with explicit seeds), so the
held-out evaluation scenes are the same on every machine.
"""

from __future__ import annotations

import io
import math
import random
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

KINDS = ("circle", "square", "triangle", "star", "diamond", "cross")
COLOURS = {
    "red": (215, 35, 35),
    "orange": (245, 135, 20),
    "yellow": (240, 215, 30),
    "green": (40, 160, 60),
    "blue": (40, 85, 215),
    "purple": (135, 55, 185),
    "pink": (245, 135, 190),
    "brown": (125, 75, 35),
}
# Reading order: the order in which lists and descriptions name the shapes.
POSITIONS = ("top", "left", "middle", "right", "bottom")
_CENTRES = {
    "top": (0.5, 0.19),
    "left": (0.19, 0.5),
    "middle": (0.5, 0.5),
    "right": (0.81, 0.5),
    "bottom": (0.5, 0.81),
}
SIZES = ("small", "big")
_RADIUS = {"small": (0.065, 0.085), "big": (0.12, 0.14)}  # fraction of the shorter side

QUESTION_KINDS = ("shapes", "colour", "count", "where", "bigger", "describe")
LANGS = ("en", "zh")

TEXT_ONLY_ANSWER = {
    "en": "I am Merlin's demo model; I only know about shapes and colours. "
    "Drop a picture of shapes, or load a Qwen3-VL checkpoint.",
    "zh": "我是 Merlin 的演示模型，只认识形状和颜色。"
    "请拖入一张形状的图片，或者加载一个 Qwen3-VL 模型。",
}

_ZH_KIND = {
    "circle": "圆形",
    "square": "正方形",
    "triangle": "三角形",
    "star": "星形",
    "diamond": "菱形",
    "cross": "十字形",
}
_ZH_COLOUR = {
    "red": "红色",
    "orange": "橙色",
    "yellow": "黄色",
    "green": "绿色",
    "blue": "蓝色",
    "purple": "紫色",
    "pink": "粉色",
    "brown": "棕色",
}
_ZH_POS = {"top": "上面", "left": "左边", "middle": "中间", "right": "右边", "bottom": "下面"}
_ZH_SIZE = {"small": "小的", "big": "大的"}
_ZH_NUM = {1: "一", 2: "两", 3: "三", 4: "四"}
_EN_NUM = {1: "one", 2: "two", 3: "three", 4: "four"}
_EN_POS = {
    "top": "at the top",
    "left": "on the left",
    "middle": "in the middle",
    "right": "on the right",
    "bottom": "at the bottom",
}


@dataclass(frozen=True)
class Shape:
    kind: str
    colour: str
    size: str
    position: str


@dataclass(frozen=True)
class Scene:
    """What is in the picture (the facts) and how it is drawn (the style, all seeded)."""

    shapes: tuple[Shape, ...]
    seed: int

    def by_kind(self, kind: str) -> Shape | None:
        return next((s for s in self.shapes if s.kind == kind), None)

    def reading_order(self) -> list[Shape]:
        return sorted(self.shapes, key=lambda s: POSITIONS.index(s.position))


def scene(seed: int, n_shapes: int | None = None) -> Scene:
    """A random scene: 1-4 shapes of distinct kinds and colours in distinct regions."""
    rng = random.Random(seed)
    n = n_shapes or rng.randint(1, 4)
    kinds = rng.sample(KINDS, n)
    colours = rng.sample(sorted(COLOURS), n)
    positions = rng.sample(POSITIONS, n)
    shapes = tuple(Shape(k, c, rng.choice(SIZES), p) for k, c, p in zip(kinds, colours, positions))
    return Scene(shapes, seed)


# ---- drawing ---------------------------------------------------------------------------------


def _polygon(kind: str, cx: float, cy: float, r: float, turn: float) -> list[tuple[float, float]]:
    def ring(n, radii, start):
        return [
            (
                cx + radii[i % len(radii)] * math.cos(start + 2 * math.pi * i / n),
                cy + radii[i % len(radii)] * math.sin(start + 2 * math.pi * i / n),
            )
            for i in range(n)
        ]

    if kind == "square":
        return ring(4, [r * 1.25], math.pi / 4)
    if kind == "diamond":
        return [(cx, cy - r * 1.2), (cx + r * 0.85, cy), (cx, cy + r * 1.2), (cx - r * 0.85, cy)]
    if kind == "triangle":
        return ring(3, [r * 1.2], -math.pi / 2 + turn)
    if kind == "star":
        return ring(10, [r * 1.2, r * 0.5], -math.pi / 2 + turn)
    if kind == "cross":
        a, b = r * 1.05, r * 0.36
        return [
            (cx - b, cy - a), (cx + b, cy - a), (cx + b, cy - b), (cx + a, cy - b),
            (cx + a, cy + b), (cx + b, cy + b), (cx + b, cy + a), (cx - b, cy + a),
            (cx - b, cy + b), (cx - a, cy + b), (cx - a, cy - b), (cx - b, cy - b),
        ]  # fmt: skip
    raise ValueError(f"unknown shape kind {kind!r}")


def _background(rng: random.Random, width: int, height: int) -> np.ndarray:
    """[H, W, 3] float32: a plain or gradient neutral background (tinted very slightly)."""

    def tone():
        level = rng.choice([rng.uniform(215, 255), rng.uniform(150, 190), rng.uniform(0, 60)])
        return np.array([level + rng.uniform(-8, 8) for _ in range(3)], np.float32)

    a = tone()
    if rng.random() < 0.5:
        return np.broadcast_to(a, (height, width, 3)).astype(np.float32)
    b = tone()
    angle = rng.uniform(0, 2 * math.pi)
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    t = (xs / width - 0.5) * math.cos(angle) + (ys / height - 0.5) * math.sin(angle)
    t = np.clip(t + 0.5, 0, 1)[..., None]
    return a * (1 - t) + b * t


def draw(sc: Scene, width: int | None = None, height: int | None = None, labels: bool = False):
    """The scene as an RGB Pillow image (size, background, jitter, noise, JPEG all seeded).
    labels=True: (image, label map), the map an [H, W] uint8 array holding i + 1 where
    sc.shapes[i] was drawn and 0 for the background (the demo model's training uses it for
    an auxiliary per-token target; the image is the same either way)."""
    rng = random.Random(sc.seed * 7919 + 17)
    if width is None or height is None:
        base = rng.randint(160, 320)
        aspect = rng.choice([1.0, 1.0, 1.0, 4 / 3, 3 / 4, 3 / 2, 2 / 3])
        width, height = int(base * math.sqrt(aspect)), int(base / math.sqrt(aspect))
    bg = _background(rng, width, height)
    canvas = Image.fromarray(np.clip(bg, 0, 255).astype(np.uint8), "RGB")
    pen = ImageDraw.Draw(canvas)
    mask = Image.new("L", (width, height), 0)
    mask_pen = ImageDraw.Draw(mask)
    side = min(width, height)
    for i, s in enumerate(sc.shapes):
        fx, fy = _CENTRES[s.position]
        cx = (fx + rng.uniform(-0.02, 0.02)) * width
        cy = (fy + rng.uniform(-0.02, 0.02)) * height
        r = rng.uniform(*_RADIUS[s.size]) * side
        colour = tuple(int(np.clip(v + rng.uniform(-18, 18), 0, 255)) for v in COLOURS[s.colour])
        if s.kind == "circle":
            box = [cx - r, cy - r, cx + r, cy + r]
            pen.ellipse(box, fill=colour)
            mask_pen.ellipse(box, fill=i + 1)
        else:
            outline = _polygon(s.kind, cx, cy, r, rng.uniform(-0.15, 0.15))
            pen.polygon(outline, fill=colour)
            mask_pen.polygon(outline, fill=i + 1)
    pixels = np.asarray(canvas, np.float32)
    noise = rng.choice([0.0, 3.0, 6.0, 10.0])
    if noise:
        pixels = pixels + np.random.default_rng(sc.seed).normal(0, noise, pixels.shape)
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
    if rng.random() < 0.4:
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=rng.randint(30, 90))
        image = Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")
    return (image, np.asarray(mask, np.uint8)) if labels else image


# ---- questions and answers -------------------------------------------------------------------

_EN_Q = {
    "shapes": [
        "What shapes are in the picture?",
        "Which shapes do you see?",
        "What shapes are there?",
        "What shapes can you see in this image?",
        "List the shapes.",
    ],
    "colour": [
        "What colour is the {a}?",
        "What color is the {a}?",
        "Which colour is the {a}?",
        "What is the colour of the {a}?",
    ],
    "count": [
        "How many shapes are there?",
        "How many shapes are in the picture?",
        "Count the shapes.",
        "How many shapes can you see?",
    ],
    "where": ["Where is the {a}?", "Where is the {a} in the picture?", "Where can I find the {a}?"],
    "bigger": [
        "Which is bigger, the {a} or the {b}?",
        "Which is larger: the {a} or the {b}?",
        "Which one is bigger, the {a} or the {b}?",
    ],
    "describe": [
        "Describe the picture.",
        "Describe this image.",
        "What is in the picture?",
        "What do you see?",
        "Tell me about this picture.",
    ],
}
_ZH_Q = {
    "shapes": ["图片里有哪些形状？", "图中有什么形状？", "你看到了哪些形状？", "有哪些形状？"],
    "colour": ["{a}是什么颜色的？", "{a}是什么颜色？", "图中的{a}是什么颜色的？"],
    "count": ["图片里有几个形状？", "一共有多少个形状？", "有几个形状？", "数一数有几个形状。"],
    "where": ["{a}在哪里？", "{a}在什么位置？", "图中的{a}在哪儿？"],
    "bigger": ["{a}和{b}哪个更大？", "{a}和{b}，哪个大？", "哪个更大，{a}还是{b}？"],
    "describe": ["描述一下这张图片。", "请描述这张图片。", "图片里有什么？", "这张图片里有什么？"],
}


def _en_list(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def answer(sc: Scene, kind: str, lang: str, a: str | None = None, b: str | None = None) -> str:
    """The one right answer to question `kind` about `sc` (a, b: the shape kinds it names)."""
    shapes = sc.reading_order()
    n = len(shapes)
    if lang == "en":
        if kind in ("colour", "where") and sc.by_kind(a) is None:
            return f"There is no {a} in the picture."
        if kind == "shapes":
            text = _en_list([_part(s, kind, lang) for s in shapes])
            return text[0].upper() + text[1:] + "."
        if kind == "colour":
            return f"The {a} is {sc.by_kind(a).colour}."
        if kind == "count":
            return "There is one shape." if n == 1 else f"There are {_EN_NUM[n]} shapes."
        if kind == "where":
            return f"The {a} is {_EN_POS[sc.by_kind(a).position]}."
        if kind == "bigger":
            return f"The {_bigger(sc, a, b)} is bigger."
        if kind == "describe":
            head = "There is one shape" if n == 1 else f"There are {_EN_NUM[n]} shapes"
            parts = [_part(s, kind, lang) for s in shapes]
            return f"{head} in the picture: {_en_list(parts)}."
    elif lang == "zh":
        if kind in ("colour", "where") and sc.by_kind(a) is None:
            return f"图片里没有{_ZH_KIND[a]}。"
        if kind == "shapes":
            items = [_part(s, kind, lang) for s in shapes]
            head = "、".join(items[:-1])
            return "有" + (head + "和" if head else "") + items[-1] + "。"
        if kind == "colour":
            return f"{_ZH_KIND[a]}是{_ZH_COLOUR[sc.by_kind(a).colour]}的。"
        if kind == "count":
            return f"有{_ZH_NUM[n]}个形状。"
        if kind == "where":
            return f"{_ZH_KIND[a]}在{_ZH_POS[sc.by_kind(a).position]}。"
        if kind == "bigger":
            return f"{_ZH_KIND[_bigger(sc, a, b)]}更大。"
        if kind == "describe":
            parts = [_part(s, kind, lang) for s in shapes]
            return f"图片里有{_ZH_NUM[n]}个形状：" + "，".join(parts) + "。"
    raise ValueError(f"unknown question {kind!r} / language {lang!r}")


LIST_KINDS = ("shapes", "describe")  # answers that name every shape, in reading order


def _part(s: Shape, kind: str, lang: str) -> str:
    """The words that name shape `s` in a list (`shapes`) or description (`describe`)."""
    if lang == "en":
        if kind == "shapes":
            return f"a {s.kind}"
        return f"a {s.size} {s.colour} {s.kind} {_EN_POS[s.position]}"
    if kind == "shapes":
        return f"一个{_ZH_KIND[s.kind]}"
    return f"{_ZH_POS[s.position]}是一个{_ZH_SIZE[s.size]}{_ZH_COLOUR[s.colour]}{_ZH_KIND[s.kind]}"


def part_spans(sc: Scene, kind: str, lang: str) -> list[tuple[int, int, int]]:
    """(index in sc.shapes, first character, end) of the words that name each shape in
    answer(sc, kind, lang), in reading order, for the list kinds (LIST_KINDS)."""
    if kind not in LIST_KINDS:
        raise ValueError(f"{kind!r} answers do not name every shape; list kinds: {LIST_KINDS}")
    text = answer(sc, kind, lang).lower()
    spans, at = [], 0
    for s in sc.reading_order():
        words = _part(s, kind, lang).lower()  # the answer capitalises its first word
        start = text.index(words, at)
        at = start + len(words)
        spans.append((sc.shapes.index(s), start, at))
    return spans


def _bigger(sc: Scene, a: str, b: str) -> str:
    sa, sb = sc.by_kind(a), sc.by_kind(b)
    if sa is None or sb is None or sa.size == sb.size:
        raise ValueError(f"'which is bigger' needs a small and a big shape: {a}, {b}")
    return a if sa.size == "big" else b


def can_ask(sc: Scene, kind: str) -> bool:
    """Whether `kind` has an unambiguous answer for this scene."""
    if kind == "bigger":
        return len({s.size for s in sc.shapes}) == 2
    return True


@dataclass(frozen=True)
class Question:
    kind: str
    lang: str
    text: str
    answer: str
    named: tuple[str, ...] = ()  # the shape kinds the question names (English), in order


def question(sc: Scene, kind: str, lang: str, seed: int, absent_rate: float = 0.15) -> Question:
    """A question of `kind` in `lang` about `sc`, worded at random (seeded), with its answer.
    Colour/where questions name a shape that is not there with probability absent_rate."""
    rng = random.Random(seed)
    a = b = None
    if kind in ("colour", "where"):
        missing = [k for k in KINDS if sc.by_kind(k) is None]
        if missing and rng.random() < absent_rate:
            a = rng.choice(missing)
        else:
            a = rng.choice(sc.shapes).kind
    elif kind == "bigger":
        small = [s.kind for s in sc.shapes if s.size == "small"]
        big = [s.kind for s in sc.shapes if s.size == "big"]
        if not small or not big:
            raise ValueError("'which is bigger' needs a small and a big shape")
        a, b = rng.choice(small), rng.choice(big)
        if rng.random() < 0.5:
            a, b = b, a
    templates = (_EN_Q if lang == "en" else _ZH_Q)[kind]
    names = (lambda k: k) if lang == "en" else (lambda k: _ZH_KIND[k] if k else k)
    text = rng.choice(templates).format(a=names(a), b=names(b))
    named = tuple(k for k in (a, b) if k)
    return Question(kind, lang, text, answer(sc, kind, lang, a, b), named)


def eval_scene_seed(kind: str, index: int) -> int:
    """Seeds of the held-out evaluation scenes: far from the training seeds (0 .. 10**8)."""
    return 10**9 + QUESTION_KINDS.index(kind) * 10**6 + index


def eval_case(kind: str, index: int) -> tuple[Scene, Question]:
    """Held-out case `index` for question `kind`: languages alternate, scenes that cannot be
    asked `kind` (bigger with equal sizes) are skipped deterministically."""
    lang = LANGS[index % 2]
    k = 0
    while True:
        seed = eval_scene_seed(kind, index) + k * 7_777_777
        sc = scene(seed, n_shapes=None if kind != "bigger" else random.Random(seed).randint(2, 4))
        if can_ask(sc, kind):
            return sc, question(sc, kind, lang, seed)
        k += 1


# ---- text-only turns -------------------------------------------------------------------------

_TEXT_ONLY_EN = [
    "Hello!",
    "Hi, who are you?",
    "What can you do?",
    "What is the capital of France?",
    "Write a poem about the sea.",
    "Explain quantum computing in simple terms.",
    "How are you today?",
    "Tell me a joke.",
    "What is 2 + 2?",
    "Translate 'good morning' into German.",
    "Can you help me with my homework?",
    "What is the weather like?",
    "Summarise this article for me.",
    "Who won the world cup?",
    "Write a Python function that sorts a list.",
    "What colour is the circle?",
    "How many shapes are there?",
    "Describe the picture.",
    "Thanks!",
]
_TEXT_ONLY_ZH = [
    "你好！",
    "你是谁？",
    "你能做什么？",
    "法国的首都是哪里？",
    "写一首关于大海的诗。",
    "给我讲个笑话。",
    "今天天气怎么样？",
    "二加二等于几？",
    "请帮我翻译这句话。",
    "圆形是什么颜色的？",
    "描述一下这张图片。",
    "谢谢！",
]
_FILLER = "the a of to and is in it you that what how why can me my please 我 你 的 是 了 吗 什么"


def text_only_prompt(rng: random.Random) -> tuple[str, str]:
    """(prompt, language) for a turn without a picture: a canned question or random words."""
    r = rng.random()
    if r < 0.4:
        return rng.choice(_TEXT_ONLY_EN), "en"
    if r < 0.65:
        return rng.choice(_TEXT_ONLY_ZH), "zh"
    words = _FILLER.split() + [w.strip("?!.") for w in " ".join(_TEXT_ONLY_EN).split()]
    text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 12)))
    if rng.random() < 0.3:
        text += "".join(chr(rng.randint(0x21, 0x7E)) for _ in range(rng.randint(1, 8)))
    return text, language_of(text)


def language_of(text: str) -> str:
    """'zh' when the text has a CJK character, else 'en' (the language the demo answers in)."""
    return "zh" if any("\u4e00" <= ch <= "\u9fff" for ch in text) else "en"


# ---- the showcase picture (screenshot, self-test) ---------------------------------------------

SHOWCASE = Scene(
    (
        Shape("triangle", "blue", "small", "top"),
        Shape("circle", "red", "big", "left"),
        Shape("star", "yellow", "big", "right"),
        Shape("square", "green", "small", "bottom"),
    ),
    seed=31,
)


def save_showcase(path, width: int = 480, height: int = 360):
    """The showcase scene as a PNG at `path` (returned as a Path)."""
    from pathlib import Path

    path = Path(path)
    draw(SHOWCASE, width, height).save(path, "PNG")
    return path
