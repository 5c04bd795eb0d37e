"""Errors a user can cause. Each carries a message that says what is wrong and what to do.

Everything the engine raises on bad input is a MerlinError subclass, so the CLI and the app can
show the message instead of a traceback.
"""

# the exit status of a command-line error the user can fix (argparse's own is 2 too)
EXIT_USER_ERROR = 2


class MerlinError(Exception):
    """Base class: the message is meant for the user."""


class CheckpointError(MerlinError):
    """A checkpoint folder, config or weights file is missing, malformed or inconsistent."""


class TokenizerError(MerlinError):
    """Tokenizer or chat-template files are missing or unusable."""


class InputError(MerlinError):
    """A prompt, image or option the user gave cannot be used."""


class ResourceError(InputError):
    """The machine lacks the memory (or disk) for what was asked; smaller settings may fit."""
