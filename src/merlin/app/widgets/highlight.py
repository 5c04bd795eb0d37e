"""Code blocks in a rendered message: background, syntax colours (Pygments), copy links.

Runs once over a finished part of a document (a finished code block is never highlighted
again while the answer streams). Qt's markdown importer marks code block lines with the
BlockCodeLanguage property and inline code with a fixed-pitch character format.
"""

from __future__ import annotations

from functools import lru_cache

from PySide6.QtGui import (
    QBrush,
    QColor,
    QFont,
    QTextBlock,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
)

from merlin.app.widgets import theme

MAX_HIGHLIGHT_CHARS = 40_000  # beyond this a block is shown plain (keeps the GUI responsive)


@lru_cache(maxsize=4)
def _style_formats(dark: bool) -> dict:
    from pygments.styles import get_style_by_name

    style = get_style_by_name("one-dark" if dark else "default")
    formats = {}
    for ttype, spec in style:
        fmt = QTextCharFormat()
        if spec["color"]:
            fmt.setForeground(QBrush(QColor("#" + spec["color"])))
        if spec["bold"]:
            fmt.setFontWeight(QFont.Bold)
        if spec["italic"]:
            fmt.setFontItalic(True)
        formats[ttype] = fmt
    return formats


def _format_for(ttype, formats: dict) -> QTextCharFormat | None:
    while ttype is not None:
        fmt = formats.get(ttype)
        if fmt is not None and (fmt.foreground().style() or fmt.fontWeight() > 400):
            return fmt
        ttype = ttype.parent
    return None


@lru_cache(maxsize=64)
def _lexer(language: str):
    from pygments.lexers import get_lexer_by_name
    from pygments.util import ClassNotFound

    if not language:
        return None
    try:
        return get_lexer_by_name(language.lower(), stripnl=False, ensurenl=False)
    except ClassNotFound:
        return None


def is_code_block(block: QTextBlock) -> bool:
    return block.blockFormat().hasProperty(QTextFormat.BlockCodeLanguage)


def code_language(block: QTextBlock) -> str:
    return str(block.blockFormat().property(QTextFormat.BlockCodeLanguage) or "")


def highlight_code(doc: QTextDocument, first: QTextBlock, last: QTextBlock, dark: bool) -> None:
    """Colour the code in blocks first..last (one fenced block) by its language."""
    lexer = _lexer(code_language(first))
    if lexer is None:
        return
    start = first.position()
    end = last.position() + last.length() - 1
    cursor = QTextCursor(doc)
    cursor.setPosition(start)
    cursor.setPosition(end, QTextCursor.KeepAnchor)
    text = cursor.selectedText().replace("\u2029", "\n")
    if len(text) > MAX_HIGHLIGHT_CHARS:
        return
    formats = _style_formats(dark)
    for index, ttype, value in lexer.get_tokens_unprocessed(text):
        fmt = _format_for(ttype, formats)
        if fmt is None or not value:
            continue
        cursor.setPosition(start + index)
        cursor.setPosition(start + index + len(value), QTextCursor.KeepAnchor)
        cursor.mergeCharFormat(fmt)


def decorate(doc: QTextDocument, from_position: int = 0) -> list[tuple[int, int]]:
    """Style the code in the document from from_position on: code block backgrounds and
    syntax colours, inline code backgrounds. Returns [(first, last) block positions] of the
    code blocks found, in order."""
    dark = theme.is_dark()
    bg = theme.code_background()
    block = doc.findBlock(from_position)
    groups: list[tuple[QTextBlock, QTextBlock]] = []
    run_first: QTextBlock | None = None
    prev: QTextBlock | None = None
    inline_bg = QTextCharFormat()
    inline_bg.setBackground(bg)
    while block.isValid():
        if is_code_block(block):
            if run_first is None:
                run_first = block
            fmt = QTextBlockFormat()
            fmt.setBackground(bg)
            fmt.setLeftMargin(8)
            fmt.setRightMargin(8)
            cursor = QTextCursor(block)
            cursor.mergeBlockFormat(fmt)
        else:
            if run_first is not None:
                groups.append((run_first, prev))
                run_first = None
            it = block.begin()
            spans = []
            while not it.atEnd():
                frag = it.fragment()
                if frag.charFormat().fontFixedPitch():
                    spans.append((frag.position(), frag.length()))
                it += 1
            for pos, length in spans:
                cursor = QTextCursor(doc)
                cursor.setPosition(pos)
                cursor.setPosition(pos + length, QTextCursor.KeepAnchor)
                cursor.mergeCharFormat(inline_bg)
        prev = block
        block = block.next()
    if run_first is not None:
        groups.append((run_first, prev))
    for first, last in groups:
        highlight_code(doc, first, last, dark)
    return [(first.position(), last.position()) for first, last in groups]
