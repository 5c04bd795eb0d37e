"""The bundle's `merlin-cli` entry point (PyInstaller)."""

import sys

from merlin.engine.cli import main

if __name__ == "__main__":
    sys.exit(main())
