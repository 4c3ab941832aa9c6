"""Precision plugins: how forward, backward and the optimizer step are cast and scaled (apex O0-O3)."""

from precision.base import Precision, build_precision, precision_skip_reason, precision_unavailable_reason

__all__ = ["Precision", "build_precision", "precision_skip_reason", "precision_unavailable_reason"]
