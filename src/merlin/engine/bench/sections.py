"""What the bench sections share: the error a section raises when something it needs is not on
this machine (the entry point prints its message, which says how to get it, and exits 2), and
the argument types that refuse a value before a run of minutes starts (a bad one had ended in
a traceback, or in a table of nan after the run)."""

from __future__ import annotations

import argparse
import math


class SectionUnavailable(RuntimeError):
    pass


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number above 0")
    return value


def image_size(text: str) -> tuple[int, int]:
    """WxH, both at least 1 (e.g. 448x448)."""
    parts = text.lower().split("x")
    try:
        width, height = (int(v) for v in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not WIDTHxHEIGHT, e.g. 448x448") from None
    if width < 1 or height < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: width and height must be at least 1")
    return width, height


def choice_list(*choices: str):
    """A comma-separated list of some of `choices` (argparse type)."""

    def parse(text: str) -> str:
        items = text.split(",")
        bad = [i for i in items if i not in choices]
        if bad or not text:
            raise argparse.ArgumentTypeError(
                f"{text!r}: give {', '.join(choices)} or several, comma-separated"
            )
        return text

    return parse
