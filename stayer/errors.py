"""Exceptions that cross layers. The CLI maps them to exit codes (DESIGN.md)."""


class ConfigError(ValueError):
    """Bad input from the user (exit 2). The message is one line naming the file, field or
    flag, and how to fix it."""
