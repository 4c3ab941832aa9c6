"""The two ways user input is refused: a bad value, or values that cannot go together."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

# The exit codes of every entry point (run.py, python -m harness.collectives, ...): here, at the bottom,
# so that no entry point imports another to learn them.
EXIT_RUN_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # as a shell reports Ctrl-C


class ConfigError(ValueError):
    """Bad user input: one line naming the key, the bad value and what is allowed."""

    def __init__(self, key: str, value: object, allowed: str) -> None:
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key}={show(value)} is not allowed: {allowed}")


class Incompatible(ConfigError):
    """Values that are each fine but cannot go together on this machine (e.g. DataParallel with apex's
    patched forward): refused before anything starts, and a `skipped` row with the reason in a sweep."""


def show(value: object) -> str:
    if isinstance(value, list | tuple):
        return "[" + ",".join(show(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def unknown_key(key: str, known: Iterable[str]) -> str:
    """What to say about a key that does not exist: the closest known one, then all of them."""
    known = sorted(known)
    if not known:
        return "no such key; this takes no options"
    leaf = key.rpartition(".")[2]
    close = difflib.get_close_matches(leaf, known, n=1, cutoff=0.6)
    hint = f"no such key; did you mean {key.rpartition('.')[0] + '.' if '.' in key else ''}{close[0]}? " if close \
        else "no such key; "
    return hint + "the keys are " + ", ".join(known)
