"""Optional packages the harness can use when they are there, and the one line to say when they are not."""

from __future__ import annotations

import importlib
import importlib.util

APEX_HELP = ("build NVIDIA apex from source at tag 25.05 or older (docs/backends.md: 'Building NVIDIA apex'); "
             "never `pip install apex`, an unrelated package")


def apex_missing(module: str) -> str | None:
    """Why `apex.<module>` (amp, parallel) cannot be used here, or None."""
    try:
        importlib.import_module(f"apex.{module}")
    except ImportError as error:
        top = importlib.util.find_spec("apex")
        what = "NVIDIA apex is not installed" if top is None else f"this apex has no apex.{module} ({error})"
        return f"{what}: {APEX_HELP}"
    return None


def package_missing(module: str, hint: str) -> str | None:
    """`hint` when `module` cannot be found, else None (nothing is imported)."""
    try:
        return None if importlib.util.find_spec(module) is not None else hint
    except (ImportError, ValueError):
        return hint
