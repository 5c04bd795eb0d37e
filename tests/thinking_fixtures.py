# ruff: noqa: E501 (the templates are Jinja lines as checkpoints write them)
"""Thinking-style chat templates and checkpoints for tests.

THINKING_TEMPLATE behaves as Qwen3-VL's -Thinking templates do: the generation prompt opens
`<think>\n`, an answer's reasoning (`reasoning_content`, or what precedes `</think>` in its
content) is rendered only for answers after the last question. SWITCHABLE_TEMPLATE behaves
as Qwen3's text templates: `enable_thinking=false` renders an empty closed block in the
generation prompt, and reasoning of earlier answers is dropped the same way.
"""

from __future__ import annotations

import shutil
from pathlib import Path

_BODY = """
{%- set ns = namespace(last_query=messages|length - 1, found=false) %}
{%- for message in messages[::-1] %}
    {%- if message.role == 'user' and not ns.found %}
        {%- set ns.found = true %}
        {%- set ns.last_query = messages|length - 1 - loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = namespace(t='') %}
        {%- for item in message.content %}
            {%- if item.type == 'image' %}
                {%- set content.t = content.t + '<|vision_start|><|image_pad|><|vision_end|>' %}
            {%- elif 'text' in item %}
                {%- set content.t = content.t + item.text %}
            {%- endif %}
        {%- endfor %}
        {%- set content = content.t %}
    {%- endif %}
    {%- if message.role == 'assistant' %}
        {%- set reasoning = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query %}
            {{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
"""

THINKING_TEMPLATE = (
    _BODY
    + """{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n<think>\\n' }}
{%- endif %}
"""
)

SWITCHABLE_TEMPLATE = (
    _BODY
    + """{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""
)


def checkpoint_with_template(demo_dir: Path, folder: Path, template: str) -> Path:
    """A copy of the demo checkpoint (weights linked) whose chat template is `template`."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in Path(demo_dir).iterdir():
        if f.name.startswith("chat_template"):
            continue
        if f.suffix == ".safetensors":
            (folder / f.name).symlink_to(f.resolve())
        elif f.is_file():
            shutil.copy2(f, folder / f.name)
    (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
    return folder
