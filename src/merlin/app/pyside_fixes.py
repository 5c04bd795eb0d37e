"""Work-arounds for PySide6 itself, applied once, before the window and the engine thread.

1. PySide6 6.12.0 on Python < 3.12 drops one reference to None on every call of a wrapped
   method that returns nothing (QLabel.setText, processEvents, ...). Python 3.12+ has an
   immortal None, so it goes unnoticed there; on 3.10/3.11 None's count reaches zero after
   some tens of thousands of calls and the process aborts ("Fatal Python error: none_dealloc")
   — within seconds of streaming. pyproject.toml excludes that release; if it is installed
   anyway, the leak is measured at start and None gets a reference count so large that the
   leak cannot reach zero (and a warning says to change the PySide6 version).
2. PySide6 hooks every import to look for `from __feature__ import ...` users by reading each
   new module's source with inspect.getsource(). Numba imports dozens of modules lazily in the
   engine thread; Merlin never uses __feature__, so the check reads the file bytes instead.
"""

from __future__ import annotations

import sys
import warnings

_installed = False
NONE_GUARD = 1 << 40  # references added to None when the leak is found (never reached)


def none_refcount_leak(calls: int = 64) -> int:
    """References to None lost by `calls` calls of a void Qt method (0 on a sound PySide6)."""
    from PySide6.QtCore import QObject

    probe = QObject()
    before = sys.getrefcount(None)
    for _ in range(calls):
        probe.setObjectName("probe")
    return before - sys.getrefcount(None)


def _guard_none() -> bool:
    if sys.version_info >= (3, 12):
        return False  # None is immortal
    if none_refcount_leak() < 32:
        return False
    import ctypes

    import PySide6

    ctypes.c_ssize_t.from_address(id(None)).value += NONE_GUARD
    warnings.warn(
        f"PySide6 {PySide6.__version__} leaks references to None on Python "
        f"{sys.version_info.major}.{sys.version_info.minor}; Merlin guards against it, but "
        "install another PySide6 version (pip install 'PySide6-Essentials!=6.12.0').",
        RuntimeWarning,
        stacklevel=2,
    )
    return True


def _quiet_feature_hook() -> None:
    feature = sys.modules.get("shibokensupport.feature")
    if feature is None or not hasattr(feature, "_mod_uses_pyside"):
        return

    def _mod_uses_pyside(module) -> bool:
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or not path.endswith(".py"):
            return False
        try:
            with open(path, "rb") as f:
                return b"PySide6" in f.read()
        except OSError:
            return False

    feature._mod_uses_pyside = _mod_uses_pyside


def install() -> None:
    global _installed
    if _installed:
        return
    import PySide6.QtCore  # noqa: F401 - loads shibokensupport.feature

    _guard_none()
    _quiet_feature_hook()
    _installed = True
