"""Tokenizer and chat template of a Hugging Face checkpoint folder, read from its own files.

Why a wrapper: the `tokenizers` package does BPE, but Merlin also needs (a) the checkpoint's
own Jinja chat template rendered exactly as transformers' `apply_chat_template` does, (b) user
text that can never turn into control tokens (a user typing `<|im_start|>` gets those
characters, not a new turn), (c) image placeholders expanded to the vision token count, and
(d) streamed output that never shows half a UTF-8 character. Special-token ids are always read
from the checkpoint, never hard-coded.

Vocabulary: in this module "special token" means every *added* token of `tokenizer.json`
(Qwen marks some, e.g. `<think>`, as non-special, but all of them steer the model). Text a
person wrote is never encoded into any of them.

Layout: the Tokenizer class (loading and checks, plain encode/decode, chat encoding with its
sentinel and escape paths). It stays one file of ~600 lines because those three share the
special-token tables and the two `tokenizers` objects (full and plain-text); the jobs around it
live apart: the template sandbox (chat_template.py), reading the files (hf_files.py), stream
decoding (stream_decoder.py), image pads (prompt_pads.py), all re-exported here.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
import tokenizers
from jinja2.sandbox import SecurityError

from .chat_template import (  # noqa: F401 (the render limits are part of this API)
    RENDER_MAX_OPS,
    RENDER_MAX_VALUE,
    RENDER_MIN_OUTPUT,
    RENDER_OPS_PER_CHAR,
    RENDER_SECONDS,
    make_jinja_env,
)
from .errors import TokenizerError
from .hf_files import _read_json, _read_text, _token_content

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_JINJA_FILE = "chat_template.jinja"
CHAT_TEMPLATE_JSON_FILE = "chat_template.json"
MEMO_TEXT_CHARS = 4096  # plain texts up to this long are memoized (Tokenizer._encode_plain)
MEMO_ENTRIES = 8192  # at most this many (a few MB)

# The tokenizer_config.json entries transformers exposes to templates (its special_tokens_map).
_TEMPLATE_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
# Private-use code points for sentinels/markers; never produced by a tokenizer from real text.
_PRIVATE_USE_START = 0xF0000
_PRIVATE_USE_END = 0x10FFFD
_SURROGATES = re.compile("[\ud800-\udfff]")


def _library_error(e: BaseException) -> bool:
    """An error the `tokenizers` library raised: a plain Exception with a message, or a Rust
    panic, which pyo3 raises as PanicException, a BaseException (a tokenizer.json whose
    continuing_subword_prefix is longer than a merge panics while loading)."""
    return isinstance(e, Exception) or type(e).__name__ == "PanicException"


def clean_text(text: str) -> str:
    """`text` with what a str can hold but UTF-8 cannot (lone surrogates, e.g. from a
    clipboard or a `surrogateescape`-decoded byte) replaced by U+FFFD; a surrogate pair left
    over from UTF-16 becomes the character it encodes. Other text is returned unchanged."""
    if not _SURROGATES.search(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _unused_private_chars(n: int, texts: Iterable[str]) -> list[str]:
    """n private-use characters that occur in none of `texts` (for sentinels and markers)."""
    used: set[str] = set()
    for t in texts:
        used.update(t)
    out: list[str] = []
    cp = _PRIVATE_USE_START
    while len(out) < n:
        if cp > _PRIVATE_USE_END:  # pragma: no cover - needs ~130k distinct private-use chars
            raise TokenizerError(
                "The messages use every private-use character; cannot tokenize them safely."
            )
        c = chr(cp)
        if c not in used:
            out.append(c)
        cp += 1
    return out


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
        raise TokenizerError("Chat messages must be a list of {'role': ..., 'content': ...} dicts.")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise TokenizerError(
                f"Chat message {i} must be a dict with a string 'role' (got {m!r:.80})."
            )
        content = m.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, Sequence) or isinstance(content, bytes):
            raise TokenizerError(
                f"Chat message {i}: 'content' must be a string or a list of items, "
                f"got {type(content).__name__}."
            )
        for j, item in enumerate(content):
            if not isinstance(item, Mapping):
                raise TokenizerError(
                    f"Chat message {i}, item {j}: must be a dict such as "
                    "{'type': 'text', 'text': ...} or {'type': 'image'}."
                )
            if "text" in item and not isinstance(item["text"], str):
                raise TokenizerError(f"Chat message {i}, item {j}: 'text' must be a string.")


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------


class Tokenizer:
    """A checkpoint's tokenizer + chat template. Build with `Tokenizer.from_folder(folder)`."""

    def __init__(
        self,
        full: tokenizers.Tokenizer,
        plain: tokenizers.Tokenizer,
        special_tokens: dict[str, int],
        vocab_size: int,
        config: Mapping[str, Any],
        chat_template: str | None,
        chat_template_source: Path | None,
        folder: Path,
    ) -> None:
        # full: matches added tokens (decode, and how transformers encodes a whole string).
        # plain: same model with no added tokens, so text never becomes a control token.
        self._full = full
        self._plain = plain
        self._memo: dict[str, tuple[int, ...]] = {}  # text -> ids (_encode_plain)
        self._longest: int | None = None  # longest_token_chars, once asked
        self._special = dict(special_tokens)  # content -> id, every added token
        self._special_ids = frozenset(self._special.values())
        self._vocab_size = vocab_size
        self.folder = folder
        self.chat_template = chat_template
        self.chat_template_source = chat_template_source
        # Leftmost-longest match of added tokens, as the `tokenizers` AddedVocabulary does.
        # an added token with empty content would match between every two characters
        alts = sorted((t for t in self._special if t), key=lambda s: (-len(s), s))
        if alts:
            self._control_re: re.Pattern[str] | None = re.compile(
                "|".join(re.escape(s) for s in alts)
            )
        else:
            self._control_re = None

        # Template variables transformers adds (its special_tokens_map: only set tokens).
        self._template_vars: dict[str, Any] = {}
        for key in _TEMPLATE_TOKEN_KEYS:
            content = _token_content(config.get(key))
            if content:
                self._template_vars[key] = content
        extra = config.get("additional_special_tokens")
        if isinstance(extra, list):
            names = [c for c in (_token_content(v) for v in extra) if c]
            if names:
                self._template_vars["additional_special_tokens"] = names
        self.eos_token: str | None = self._template_vars.get("eos_token")
        self.pad_token: str | None = self._template_vars.get("pad_token")
        self.bos_token: str | None = self._template_vars.get("bos_token")

        self._template: jinja2.Template | None = None
        if chat_template is not None:
            try:
                self._template = make_jinja_env().from_string(chat_template)
            except jinja2.TemplateSyntaxError as e:
                raise TokenizerError(
                    f"The chat template in {chat_template_source} has a Jinja syntax error on "
                    f"line {e.lineno}: {e.message}. Fix the template or replace the file with "
                    "the original from the model download."
                ) from e
            except Exception as e:  # e.g. `{% break %}` outside a loop compiles to bad Python
                raise TokenizerError(
                    f"The chat template in {chat_template_source} cannot be compiled "
                    f"({type(e).__name__}: {e}). Fix the template or replace the file with the "
                    "original from the model download."
                ) from None

    # ---- loading ---------------------------------------------------------------------------

    @classmethod
    def from_folder(cls, folder: Path | str) -> Tokenizer:
        """Load tokenizer.json (required), tokenizer_config.json and the chat template."""
        folder = Path(folder)
        if not folder.is_dir():
            raise TokenizerError(
                f"{folder} is not a folder. Point Merlin at the model folder that holds "
                f"{TOKENIZER_FILE}."
            )
        tok_path = folder / TOKENIZER_FILE
        if not os.path.lexists(tok_path):  # a broken link or a loop: _read_json says so
            raise TokenizerError(
                f"{tok_path} is missing. Merlin needs the Hugging Face fast-tokenizer file; "
                "download the complete model folder (including tokenizer.json)."
            )
        tok_json = _read_json(tok_path)
        if not isinstance(tok_json, dict) or not isinstance(tok_json.get("model"), dict):
            raise TokenizerError(
                f"{tok_path} is not a Hugging Face tokenizer file (no 'model' section). "
                "Replace it with the original tokenizer.json from the model download."
            )
        # Never truncate or pad silently; Merlin checks prompt length itself.
        tok_json["truncation"] = None
        tok_json["padding"] = None
        try:
            full = tokenizers.Tokenizer.from_str(json.dumps(tok_json))
            plain_json = dict(tok_json, added_tokens=[], post_processor=None)
            plain = tokenizers.Tokenizer.from_str(json.dumps(plain_json))
        except BaseException as e:  # the Rust side: Exception with a message, or a panic
            if not _library_error(e):
                raise
            raise TokenizerError(
                f"{tok_path} cannot be loaded by the tokenizers library ({e}). Replace it with "
                "the original tokenizer.json from the model download, or update `tokenizers`."
            ) from e

        special: dict[str, int] = {}
        added = tok_json.get("added_tokens") or []
        if not isinstance(added, list):
            raise TokenizerError(
                f"{tok_path}: 'added_tokens' must be a list. Replace the file with the original "
                "from the model download."
            )
        for entry in added:
            if not (
                isinstance(entry, dict)
                and isinstance(entry.get("content"), str)
                and isinstance(entry.get("id"), int)
                and not isinstance(entry.get("id"), bool)
                and entry["id"] >= 0
            ):
                raise TokenizerError(
                    f"{tok_path}: malformed entry in 'added_tokens': {entry!r:.120}. Replace "
                    "the file with the original from the model download."
                )
            special[entry["content"]] = entry["id"]

        config: dict[str, Any] = {}
        cfg_path = folder / TOKENIZER_CONFIG_FILE
        if cfg_path.exists():
            loaded = _read_json(cfg_path)
            if not isinstance(loaded, dict):
                raise TokenizerError(
                    f"{cfg_path} must hold a JSON object. Replace it with the original file."
                )
            config = loaded
            cls._check_added_tokens_decoder(cfg_path, config, special, tok_path)

        vocab_ids = full.get_vocab(with_added_tokens=True).values()
        vocab_size = max(vocab_ids, default=-1) + 1
        if vocab_size == 0:
            raise TokenizerError(f"{tok_path} has an empty vocabulary. Replace the file.")

        template, source = cls._find_chat_template(folder, config)
        return cls(full, plain, special, vocab_size, config, template, source, folder)

    @staticmethod
    def _check_added_tokens_decoder(
        cfg_path: Path, config: dict[str, Any], special: dict[str, int], tok_path: Path
    ) -> None:
        """added_tokens_decoder must agree with tokenizer.json (same strings, same ids)."""
        decoder = config.get("added_tokens_decoder")
        if decoder is None:
            return
        if not isinstance(decoder, dict):
            raise TokenizerError(f"{cfg_path}: 'added_tokens_decoder' must be a JSON object.")
        for key, value in decoder.items():
            content = _token_content(value)
            try:
                tid = int(key)
            except ValueError:
                tid = None
            if content is None or tid is None:
                raise TokenizerError(
                    f"{cfg_path}: malformed 'added_tokens_decoder' entry {key!r}. Replace the "
                    "file with the original from the model download."
                )
            if special.get(content) != tid:
                raise TokenizerError(
                    f"{cfg_path} says added token {content!r} has id {tid}, but {tok_path} "
                    f"{'gives id ' + str(special[content]) if content in special else 'lacks it'}"
                    ". The two files come from different checkpoints; download them together."
                )

    @staticmethod
    def _find_chat_template(
        folder: Path, config: Mapping[str, Any]
    ) -> tuple[str | None, Path | None]:
        """chat_template.jinja, then chat_template.json, then tokenizer_config.json."""
        jinja_path = folder / CHAT_TEMPLATE_JINJA_FILE
        if jinja_path.exists():
            return _read_text(jinja_path), jinja_path
        json_path = folder / CHAT_TEMPLATE_JSON_FILE
        if json_path.exists():
            data = _read_json(json_path)
            if not isinstance(data, dict) or not isinstance(data.get("chat_template"), str):
                raise TokenizerError(
                    f"{json_path} must be a JSON object with a string 'chat_template'. Replace "
                    "it with the original file from the model download."
                )
            return data["chat_template"], json_path
        cfg_path = folder / TOKENIZER_CONFIG_FILE
        tmpl = config.get("chat_template")
        if tmpl is None:
            return None, None
        if isinstance(tmpl, str):
            return tmpl, cfg_path
        if isinstance(tmpl, list):
            for entry in tmpl:
                if (
                    isinstance(entry, dict)
                    and entry.get("name") == "default"
                    and isinstance(entry.get("template"), str)
                ):
                    return entry["template"], cfg_path
            raise TokenizerError(
                f"{cfg_path}: 'chat_template' is a list without a template named 'default'. "
                "Add one, or put the template in chat_template.jinja."
            )
        raise TokenizerError(
            f"{cfg_path}: 'chat_template' must be a string or a list of "
            "{'name', 'template'} entries."
        )

    # ---- vocabulary ------------------------------------------------------------------------

    @property
    def special_tokens(self) -> dict[str, int]:
        """Every added token of the checkpoint: content -> id (a copy)."""
        return dict(self._special)

    @property
    def vocab_size(self) -> int:
        """Number of ids including added tokens (max id + 1); the model may pad beyond it."""
        return self._vocab_size

    @property
    def longest_token_chars(self) -> int:
        """Characters of the vocabulary's longest token string (a byte-level token's string
        has a character per byte, at least as many as the text it stands for): a plain text
        of n characters is at least n / this many tokens."""
        if self._longest is None:
            self._longest = max(map(len, self._plain.get_vocab(with_added_tokens=True)), default=1)
        return max(1, self._longest)

    def token_id(self, token: str) -> int:
        """Id of a token string (special or vocabulary); TokenizerError if absent."""
        tid = self._special.get(token)
        if tid is None:
            tid = self._full.token_to_id(token)
        if tid is None:
            raise TokenizerError(
                f"Token {token!r} is not in {self.folder / TOKENIZER_FILE}. This checkpoint is "
                "not a Qwen3-VL-style tokenizer, or the file is incomplete."
            )
        return tid

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    # ---- plain text ------------------------------------------------------------------------

    def encode_text(self, text: str) -> list[int]:
        """Ids of plain text. Special-token strings in it stay ordinary characters."""
        if not isinstance(text, str):
            raise TypeError(f"encode_text expects str, got {type(text).__name__}")
        if not text:
            return []
        return self._encode_plain(clean_text(text))

    def _encode_plain(self, text: str) -> list[int]:
        """BPE ids of plain text. Short texts are memoized: a chat's prompt is re-encoded every
        turn, stretch by stretch, and all but the newest stretches were seen before."""
        memo = self._memo
        if len(text) <= MEMO_TEXT_CHARS:
            hit = memo.get(text)
            if hit is not None:
                return list(hit)
        ids = self._encode_uncached(text)
        if len(text) <= MEMO_TEXT_CHARS:
            if len(memo) >= MEMO_ENTRIES:
                memo.clear()  # bounded; the next turn refills what it uses
            memo[text] = tuple(ids)
        return ids

    def _encode_uncached(self, text: str) -> list[int]:
        try:
            return self._plain.encode(text, add_special_tokens=False).ids
        except BaseException as e:  # the Rust side: a tokenizer.json that loads, cannot encode
            if not _library_error(e):
                raise
            raise TokenizerError(
                f"{self.folder / TOKENIZER_FILE} cannot encode this text ({e}). Replace it with "
                "the original tokenizer.json from the model download."
            ) from None

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of `ids`. Special tokens show as their strings unless `skip_special`.

        Ids the tokenizer does not know (e.g. the model's padded vocabulary rows) decode to "".
        Invalid UTF-8 (an incomplete character) decodes to U+FFFD, as in transformers.
        """
        id_list = [int(i) for i in ids]
        if skip_special:
            id_list = [i for i in id_list if i not in self._special_ids]
        try:
            return self._full.decode(id_list, skip_special_tokens=False)
        except BaseException as e:  # the Rust side: e.g. an id beyond u32
            if not _library_error(e):
                raise
            raise TokenizerError(f"cannot decode token ids ({e}).") from None

    def stream_decoder(self, skip_special: bool = False):
        return StreamDecoder(self, skip_special=skip_special)

    # ---- chat ------------------------------------------------------------------------------

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """The checkpoint's chat template applied to `messages`, as transformers renders it.

        messages: [{"role": "system"|"user"|"assistant", "content": str | [
            {"type": "text", "text": str} | {"type": "image"} | {"type": "video"}, ...]}]
        Extra keyword arguments (e.g. add_vision_id=True) are passed to the template.
        """
        _check_messages(messages)
        return self._render(messages, add_generation_prompt, template_kwargs)

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        *,
        token_ids: Mapping[int, Sequence[int]] | None = None,
        **template_kwargs: Any,
    ) -> list[int]:
        """Token ids of the rendered chat: the template's control tokens are control tokens,
        everything a person (or the model, in earlier turns) wrote is plain text.

        token_ids: message index -> the ids a message's string `content` was generated as
        (an answer of the model). They are used as they are, instead of encoding the text,
        when the template renders every text unchanged (the first path below): models emit
        non-canonical tokenizations, and the KV cache of an earlier turn holds those ids.
        Otherwise (the fallback path) the text is encoded like any other.

        Method: render once with each text replaced by a sentinel, rebuild the string with
        the real texts and check it equals the real render. Then control tokens are matched
        only in template-written pieces, and each stretch between control tokens (template
        text and message text together) is BPE-encoded in one go, exactly as transformers
        does. For messages without special-token strings the result equals encoding the
        rendered string in one go.

        If the template transforms the text (e.g. `.strip()`, or takes decisions from it), the
        rebuilt string differs; then every character that starts a special token is swapped
        for a private-use marker in the texts before rendering, control tokens are matched in
        the result, and the markers are swapped back inside the plain-text stretches. This
        path is also exact for ordinary text, unless the template's decisions depend on a
        special string inside a message (e.g. a Thinking template splitting an assistant
        turn at `</think>`): such text stays plain text. Keep reasoning out of `content`.
        """
        _check_messages(messages)
        messages = self._map_texts(messages, clean_text)
        rendered = self._render(messages, add_generation_prompt, template_kwargs)
        if messages and not rendered:
            raise TokenizerError(
                f"The chat template ({self.chat_template_source}) renders nothing for the "
                "conversation, so there is no prompt to answer. Replace it with the original "
                "template from the model download."
            )

        texts: list[str] = []
        fixed: dict[int, list[int]] = {}  # text index -> the ids it is taken as
        sentinel = _unused_private_chars(1, self._all_texts(messages, self.chat_template))[0]
        token_ids = token_ids or {}
        protected = []
        for i, m in enumerate(messages):
            content = m.get("content")
            first = [isinstance(content, str) and bool(content) and i in token_ids]

            def protect(text: str, first=first, i=i) -> str:
                if first[0]:  # _map_texts passes a string content first
                    fixed[len(texts)] = [int(t) for t in token_ids[i]]
                    first[0] = False
                texts.append(text)
                return f"{sentinel}{len(texts) - 1}{sentinel}"

            protected += self._map_texts([m], protect)

        templated = self._render(protected, add_generation_prompt, template_kwargs)
        parts = re.split(f"{sentinel}([0-9]+){sentinel}", templated)
        segments: list[tuple[str, bool, list[int] | None]] = []  # (text, by template?, ids)
        intact = True
        for i, part in enumerate(parts):
            if i % 2 == 0:
                segments.append((part, True, None))
            elif int(part) < len(texts):
                segments.append((texts[int(part)], False, fixed.get(int(part))))
            else:
                intact = False
        if intact and "".join(s for s, _, _ in segments) == rendered:
            return self._encode_segments(segments, None)

        # Fallback: the template changed the texts. Escape instead of replacing them.
        starts = sorted({s[0] for s in self._special if s})
        markers = _unused_private_chars(len(starts), self._all_texts(messages, self.chat_template))
        escape = str.maketrans(dict(zip(starts, markers)))
        unescape = str.maketrans(dict(zip(markers, starts)))
        escaped = self._render(
            self._map_texts(messages, lambda t: t.translate(escape)),
            add_generation_prompt,
            template_kwargs,
        )
        return self._encode_segments([(escaped, True, None)], unescape)

    def _render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool,
        template_kwargs: Mapping[str, Any],
    ) -> str:
        if self._template is None:
            raise TokenizerError(
                f"{self.folder} has no chat template (looked for {CHAT_TEMPLATE_JINJA_FILE}, "
                f"{CHAT_TEMPLATE_JSON_FILE} and 'chat_template' in {TOKENIZER_CONFIG_FILE}). "
                "Use an Instruct checkpoint, or add the template file from the model download."
            )
        variables: dict[str, Any] = dict(self._template_vars)
        variables.update(template_kwargs)
        variables.update(
            messages=messages,
            tools=template_kwargs.get("tools"),
            documents=template_kwargs.get("documents"),
            add_generation_prompt=add_generation_prompt,
        )
        written = sum(len(t) for t in self._all_texts(messages, None))
        max_output = 2 * written + RENDER_MIN_OUTPUT
        try:
            return self._template.environment.render_budgeted(
                self._template,
                max_output,
                variables,
                RENDER_MAX_OPS + int(RENDER_OPS_PER_CHAR * written),
            )
        except SecurityError as e:
            raise TokenizerError(
                f"The chat template ({self.chat_template_source}) was stopped: {e}. Replace it "
                "with the original template from the model download."
            ) from None
        except jinja2.TemplateError as e:
            raise TokenizerError(
                f"The chat template ({self.chat_template_source}) rejected the conversation: {e}"
            ) from e
        except Exception as e:  # a template can hit TypeError etc. on odd message data
            raise TokenizerError(
                f"The chat template ({self.chat_template_source}) failed on the conversation: "
                f"{type(e).__name__}: {e}"
            ) from e

    @staticmethod
    def _map_texts(messages: Sequence[Mapping[str, Any]], fn: Any) -> list[dict[str, Any]]:
        """Copies of `messages` with every non-empty written text passed through `fn`.

        Written text = string `content`, `text` of content items, `reasoning_content`.
        Empty strings are left alone: templates test them for truthiness.
        """
        out: list[dict[str, Any]] = []
        for m in messages:
            new = dict(m)
            content = m.get("content")
            if isinstance(content, str):
                if content:
                    new["content"] = fn(content)
            elif content is not None:
                items = []
                for item in content:
                    item = dict(item)
                    if isinstance(item.get("text"), str) and item["text"]:
                        item["text"] = fn(item["text"])
                    items.append(item)
                new["content"] = items
            if isinstance(m.get("reasoning_content"), str) and m["reasoning_content"]:
                new["reasoning_content"] = fn(m["reasoning_content"])
            out.append(new)
        return out

    @classmethod
    def _all_texts(cls, messages: Sequence[Mapping[str, Any]], template: str | None) -> list[str]:
        texts: list[str] = [template or ""]
        cls._map_texts(messages, lambda t: texts.append(t) or t)
        return texts

    def _encode_segments(
        self,
        segments: Sequence[tuple[str, bool, list[int] | None]],
        unescape: dict[int, int] | None,
    ) -> list[int]:
        """Match control tokens in template-written segments; BPE the stretches between them;
        a segment with ids is taken as those ids (and ends the stretch before it)."""
        ids: list[int] = []
        buf: list[str] = []

        def flush() -> None:
            text = "".join(buf)
            buf.clear()
            if unescape is not None:
                text = text.translate(unescape)
            if text:
                ids.extend(self._encode_plain(text))

        for text, by_template, fixed in segments:
            if fixed is not None:
                flush()
                ids.extend(fixed)
                continue
            if not by_template or self._control_re is None:
                buf.append(text)
                continue
            pos = 0
            for m in self._control_re.finditer(text):
                buf.append(text[pos : m.start()])
                flush()
                ids.append(self._special[m.group()])
                pos = m.end()
            buf.append(text[pos:])
        flush()
        return ids


from .prompt_pads import expand_image_pads  # noqa: E402, F401 (re-exported)
from .stream_decoder import StreamDecoder  # noqa: E402 (it needs Tokenizer's name only)
