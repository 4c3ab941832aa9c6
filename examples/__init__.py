"""Workloads of one's own, as the harness takes them (docs/workloads.md)."""
