"""A small Qwen2-style tokenizer for the demo checkpoint, trained here on text we wrote.

Why: the demo model (random weights, vocab 2048) needs a real tokenizer folder that exercises
the same code paths as Qwen3-VL's: byte-level BPE with Qwen2's pre-tokenizer, NFC, every Qwen
special token (same strings, same order) as added tokens read from the files, and a ChatML
template that renders like the Qwen3-VL Instruct one. Training takes milliseconds and the
files are byte-identical on every run, so the demo checkpoint is reproducible.
"""

from __future__ import annotations

import json
from pathlib import Path

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, trainers

DEMO_VOCAB_SIZE = 2048  # the demo model's embedding rows; BPE + special tokens must fit
DEMO_MODEL_MAX_LENGTH = 262144  # as Qwen3-VL's tokenizer_config.json

# Qwen2's pre-tokenisation regex (spec section 6).
QWEN2_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CJK_REGEX = r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]"

# Qwen's added tokens, in id order (151643 ... 151668 in the real checkpoint).
QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)

# What Qwen2-VL/Qwen3-VL list as additional_special_tokens in tokenizer_config.json.
_ADDITIONAL_SPECIAL_TOKENS = QWEN_SPECIAL_TOKENS[1:14]

# ChatML, written for Merlin, rendering like the Qwen3-VL Instruct template for system /
# user / assistant turns: no default system prompt, images and videos inline as
# <|vision_start|><|image_pad|><|vision_end|> (or <|video_pad|>), optional "Picture N: ".
DEMO_CHAT_TEMPLATE = """\
{%- set counts = namespace(image=0, video=0) -%}
{%- macro render_content(content, role) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is iterable and content is not mapping -%}
        {%- for item in content -%}
            {%- if item.type == 'image' or 'image' in item or 'image_url' in item -%}
                {%- if role == 'system' -%}
                    {{- raise_exception('A system message cannot contain images.') -}}
                {%- endif -%}
                {%- set counts.image = counts.image + 1 -%}
                {%- if add_vision_id -%}
                    {{- 'Picture ' ~ counts.image ~ ': ' -}}
                {%- endif -%}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
            {%- elif item.type == 'video' or 'video' in item -%}
                {%- if role == 'system' -%}
                    {{- raise_exception('A system message cannot contain videos.') -}}
                {%- endif -%}
                {%- set counts.video = counts.video + 1 -%}
                {%- if add_vision_id -%}
                    {{- 'Video ' ~ counts.video ~ ': ' -}}
                {%- endif -%}
                {{- '<|vision_start|><|video_pad|><|vision_end|>' -}}
            {%- elif 'text' in item -%}
                {{- item.text -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- for message in messages -%}
    {%- if message.role not in ['system', 'user', 'assistant'] -%}
        {{- raise_exception('Unknown message role: ' ~ message.role) -}}
    {%- endif -%}
    {%- if message.role == 'system' and not loop.first -%}
        {{- raise_exception('Only the first message can be a system message.') -}}
    {%- endif -%}
    {{- '<|im_start|>' ~ message.role ~ '\\n' -}}
    {{- render_content(message.content, message.role) -}}
    {{- '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\\n' -}}
{%- endif -%}
"""

# Training text, written for this project: English prose, Chinese, code, numbers, emoji and
# the chat words, so the merges look like a real tokenizer's (common words whole, rare
# characters as bytes).
DEMO_CORPUS = """\
Merlin is a small desktop chat program. You drop a picture into the window, ask a question
about it, and watch the answer appear word by word. The model runs on the computer itself,
without a network connection, so your pictures and questions stay with you.
The wizard kept an owl, a lamp and a long shelf of books. Every evening he read about the
stars, the rivers and the mountains, and every morning he wrote down what he had learned.
"What is in this image?" asked the user. The assistant looked carefully and answered: "A red
bicycle leans against a stone wall. There is a cat sitting on the seat, and the sun is low."
The system prompt tells the assistant to be helpful, honest and brief. When the user asks
for a summary, the assistant gives the main points first and the details after that.
It's a quiet afternoon; we're reading, they've gone out, I'm writing, you'll see, she'd know.
Describe this image. Describe the picture in one sentence. What colour is the car? How many
people are in the photo? Is the text on the sign readable? Read the numbers on the board.
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a
single step. Time flies like an arrow; fruit flies like a banana.
Speculative decoding guesses the next few tokens and checks them in one pass. When the guess
is right, several tokens arrive for the price of one step; when it is wrong, nothing is lost.
The cache keeps the keys and values of every position, so each new token only needs one row.
On a small board with eight cores, memory bandwidth decides how fast the words come. Every
generated token reads all the weights once, which is why smaller numbers, packed into four or
eight bits, make the answer arrive sooner. Pictures are cut into square patches, turned into
vectors and merged in groups of four before the language model ever sees them.
A good answer is short when the question is simple and careful when the question is hard.
If you are not sure, say so. If the picture is too dark to read, ask for a brighter one.
Yesterday the weather changed quickly: first rain, then wind, then a bright and cold evening.
Children played in the park, a dog chased a ball, and an old man fed bread to the ducks.
Please translate the following sentence into French, German and Spanish, then explain why.
Thank you very much! You're welcome. Could you help me with my homework? Of course I can.
Open the file, read every line, count the words, and print the ten most common ones.

下午我们一起去图书馆看书，然后在咖啡店喝茶聊天。这本书讲的是一个少年和一只狗的故事。
请把下面这段话翻译成英文，并解释其中的语法。你能帮我检查一下这段代码有没有错误吗？
北京、上海、广州和深圳都是中国的大城市。长江是中国最长的河流，黄河被称为母亲河。
我喜欢吃米饭、面条和饺子，也喜欢喝绿茶。周末的时候，我常常和朋友一起爬山。
这台电脑的内存是十六吉字节，处理器有八个核心，运行速度很快。

梅林是一个小巧的桌面聊天程序。你把一张图片拖进窗口，提出问题，然后看着回答一个字一个字地出现。
模型在你自己的电脑上运行，不需要网络，所以你的图片和问题都留在你身边。
这张图片里有什么？图片里有一辆红色的自行车靠在石墙上，座位上坐着一只猫，太阳快要落山了。
请用一句话描述这张图片。图中有几个人？牌子上的文字能看清楚吗？
今天天气很好，我们去公园散步吧。学习中文需要时间，但是每天练习一点就会进步。
人工智能可以帮助我们理解图像和文字。这个模型会看图，也会回答问题。
春天来了，花开了，小鸟在树上唱歌。老师说：“读书使人进步。”谢谢你的帮助！

def fibonacci(n: int) -> list[int]:
    \"\"\"Return the first n Fibonacci numbers.\"\"\"
    values = [0, 1]
    while len(values) < n:
        values.append(values[-1] + values[-2])
    return values[:n]


class Counter:
    def __init__(self) -> None:
        self.count = 0

    def add(self, amount: int = 1) -> int:
        self.count += amount
        return self.count


for i in range(10):
    if i % 2 == 0:
        print(f"{i} is even")
    else:
        print(f"{i} is odd")

import numpy as np
x = np.zeros((4, 8), dtype=np.float32)
y = x @ x.T + 1.0
result = {"name": "merlin", "version": "0.1.0", "tokens": [1, 2, 3], "ok": true}
if (a < b && c >= d) { return a->next; } // C style
SELECT id, name FROM users WHERE age > 21 ORDER BY name;

async def fetch_all(urls: list[str]) -> dict[str, bytes]:
    results: dict[str, bytes] = {}
    for url in sorted(set(urls)):
        try:
            results[url] = await download(url, timeout=30)
        except TimeoutError as error:
            logger.warning("timeout for %s: %s", url, error)
    return results

const total = items.filter((item) => item.price > 0).reduce((sum, item) => sum + item.price, 0);
fn main() { let v: Vec<u32> = (1..=10).map(|x| x * x).collect(); println!("{:?}", v); }
<div class="message user"><img src="cat.png" alt="a cat"/><p>Hello, world!</p></div>

0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 25 32 64 100 128 256 512 1024 2048
3.14159 2.71828 1.41421 0.5 -1 +42 1,000,000 99% 12:30 2025-01-31 $19.99 #7 v2.1
The board shows 4096 tokens per second at 1.5 GHz, about 8 GB of memory and 32 cores.

Emoji: 😀 😃 😄 😁 😂 🙂 😉 😊 😍 🤔 👍 👏 🙏 🎉 🔥 ✨ 🌟 ❤️ 💡 🚀 🐱 🐶 🦉 🌍 🍎 ☕ 📷 🖼️
Great job! 🎉 Thanks 🙏 See you soon 👋 The owl 🦉 watches the stars ✨ at night 🌙.
Mixed text: Merlin 梅林 reads 图片 and answers 回答 with 😊 and numbers 123.
"""


def _build(
    corpus_lines: list[str] | None = None, vocab_size: int = DEMO_VOCAB_SIZE, split_cjk=False
) -> tokenizers.Tokenizer:
    tok = tokenizers.Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    # split_cjk: every CJK ideograph its own piece first, so Chinese merges stay characters
    # (compositional: "红色" + "圆形", not one token per phrase seen in training).
    cjk = [pre_tokenizers.Split(Regex(CJK_REGEX), behavior="isolated")] if split_cjk else []
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            *cjk,
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(QWEN_SPECIAL_TOKENS),
        min_frequency=1,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    if corpus_lines is None:
        corpus_lines = DEMO_CORPUS.splitlines(keepends=True)
    tok.train_from_iterator(corpus_lines, trainer=trainer)
    tok.add_special_tokens(
        [
            AddedToken(s, single_word=False, lstrip=False, rstrip=False, normalized=False)
            for s in QWEN_SPECIAL_TOKENS
        ]
    )
    return tok


def _tokenizer_json(tok: tokenizers.Tokenizer) -> dict:
    data = json.loads(tok.to_str())
    # Spell the byte-level parts exactly as Qwen2's tokenizer.json does.
    byte_level = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": False,
        "use_regex": False,
    }
    data["post_processor"] = dict(byte_level)
    data["decoder"] = dict(byte_level)
    data["model"]["continuing_subword_prefix"] = ""
    data["model"]["end_of_word_suffix"] = ""
    return data


def write_demo_tokenizer(folder: Path) -> None:
    """Write tokenizer.json, tokenizer_config.json and chat_template.json into `folder`."""
    write_tokenizer_files(folder, None, DEMO_VOCAB_SIZE, DEMO_CHAT_TEMPLATE)


def write_tokenizer_files(
    folder: Path,
    corpus_lines: list[str] | None,
    vocab_size: int,
    chat_template: str,
    split_cjk: bool = False,
) -> None:
    """The same files for a tokenizer trained on `corpus_lines` (None: DEMO_CORPUS) with at
    most `vocab_size` ids, special tokens included (the trained demo model uses this)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer_json(_build(corpus_lines, vocab_size, split_cjk))

    added = tok["added_tokens"]
    bpe_size = len(tok["model"]["vocab"])
    if [a["content"] for a in added] != list(QWEN_SPECIAL_TOKENS) or [
        a["id"] for a in added
    ] != list(range(bpe_size, bpe_size + len(QWEN_SPECIAL_TOKENS))):
        raise RuntimeError("demo tokenizer: special tokens did not land right after the BPE vocab")
    if bpe_size + len(added) > vocab_size:
        raise RuntimeError(f"demo tokenizer: {bpe_size + len(added)} ids > {vocab_size}")

    config = {
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(a["id"]): {
                "content": a["content"],
                "lstrip": a["lstrip"],
                "normalized": a["normalized"],
                "rstrip": a["rstrip"],
                "single_word": a["single_word"],
                "special": a["special"],
            }
            for a in added
        },
        "additional_special_tokens": list(_ADDITIONAL_SPECIAL_TOKENS),
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": DEMO_MODEL_MAX_LENGTH,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    _write_json(folder / "tokenizer.json", tok)
    _write_json(folder / "tokenizer_config.json", config)
    _write_json(folder / "chat_template.json", {"chat_template": chat_template})


def _write_json(path: Path, data: object) -> None:
    text = json.dumps(data, ensure_ascii=False, indent=2) + "\n"
    path.write_bytes(text.encode("utf-8"))
