"""The bundle's entry point (PyInstaller): the same `merlin` command as the venv install."""

import sys

from merlin.app.main import main

if __name__ == "__main__":
    sys.exit(main())
