"""The window and its widgets (Qt)."""
