"""What the bench sections share: the error a section raises when something it needs is not on
this machine (the entry point prints its message, which says how to get it, and exits 2)."""


class SectionUnavailable(RuntimeError):
    pass
