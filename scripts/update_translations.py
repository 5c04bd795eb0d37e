#!/usr/bin/env python3
"""Collect the app's translatable strings into src/merlin/app/i18n/merlin_zh_CN.ts; compile the
.qm.

Strings are the literal first arguments of `tr(...)` and `N_(...)` in src/merlin/app/ (also
called as a method: `self.tr(...)`). Existing
translations are kept; new strings are added as unfinished (Qt Linguist can edit the .ts);
strings no longer used are dropped. Then pyside6-lrelease writes merlin_zh_CN.qm.

    python scripts/update_translations.py          # update .ts and .qm
    python scripts/update_translations.py --check  # exit 1 if anything is missing or stale
"""

from __future__ import annotations

import argparse
import ast
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "src" / "merlin" / "app"
TS = APP / "i18n" / "merlin_zh_CN.ts"
QM = TS.with_suffix(".qm")
CONTEXT = "Merlin"


def _called_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def collect() -> list[tuple[str, str, int]]:
    """[(source text, file, line)] in order of first use."""
    seen: dict[str, tuple[str, str, int]] = {}
    for path in sorted(APP.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and _called_name(node.func) in ("tr", "N_")  # tr(...), self.tr(...)
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                text = node.args[0].value
                if text not in seen:
                    rel = path.relative_to(APP.parent).as_posix()
                    seen[text] = (text, rel, node.lineno)
    return sorted(seen.values(), key=lambda t: (t[1], t[2]))


def read_ts(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    out = {}
    for msg in ET.parse(path).getroot().iter("message"):
        source = msg.findtext("source") or ""
        tr_el = msg.find("translation")
        if tr_el is not None and tr_el.get("type") != "unfinished" and tr_el.text:
            out[source] = tr_el.text
    return out


def render_ts(strings, translations: dict[str, str]) -> str:
    root = ET.Element("TS", version="2.1", language="zh_CN", sourcelanguage="en")
    ctx = ET.SubElement(root, "context")
    ET.SubElement(ctx, "name").text = CONTEXT
    for text, file, _line in strings:
        msg = ET.SubElement(ctx, "message")
        # the file only: line numbers would make every edit of app/ stale the .ts
        ET.SubElement(msg, "location", filename=f"../../{file}")
        ET.SubElement(msg, "source").text = text
        t = ET.SubElement(msg, "translation")
        if text in translations:
            t.text = translations[text]
        else:
            t.set("type", "unfinished")
    ET.indent(root)
    return (
        '<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE TS>\n'
        + ET.tostring(root, encoding="unicode")
        + "\n"
    )


def lrelease() -> str:
    exe = shutil.which("pyside6-lrelease") or str(Path(sys.executable).parent / "pyside6-lrelease")
    return exe


def compile_qm(ts: Path, qm: Path) -> None:
    subprocess.run([lrelease(), "-silent", str(ts), "-qm", str(qm)], check=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true")
    args = p.parse_args(argv)
    strings = collect()
    translations = read_ts(TS)
    text = render_ts(strings, translations)
    missing = [s for s, _, _ in strings if s not in translations]
    if args.check:
        problems = []
        if missing:
            problems.append(f"{len(missing)} strings have no Chinese translation:")
            problems += [f"  {m!r}" for m in missing]
        if TS.read_text(encoding="utf-8") != text:
            problems.append(f"{TS} is stale: run scripts/update_translations.py")
        with tempfile.TemporaryDirectory() as tmp:
            fresh = Path(tmp) / "fresh.qm"
            compile_qm(TS, fresh)
            if not QM.is_file() or QM.read_bytes() != fresh.read_bytes():
                problems.append(f"{QM} is stale: run scripts/update_translations.py")
        print("\n".join(problems) or "translations are complete and up to date")
        return 1 if problems else 0
    TS.write_text(text, encoding="utf-8")
    compile_qm(TS, QM)
    print(f"{len(strings)} strings, {len(missing)} without translation; wrote {TS.name}, {QM.name}")
    for m in missing:
        print(f"  missing: {m!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
