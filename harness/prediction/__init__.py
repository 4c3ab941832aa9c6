"""Predictions before launch: each rank's peak memory and each iteration's time, for this machine or a
hardware preset, without training (docs/plan.md).

One job per module: `hardware` (the presets of conf/plan/hardware/, checked, and this machine's measured
one), `links` (the latency-bandwidth model of collectives, and its fit), `trace` (one rank's training step on
fake tensors: memory by kind at the peak, FLOPs), `calibrate` (this machine's measured compute, bare or through the
strategy), `predict` (a combination's prediction from those), `targets` (this machine's preset or a named one,
with the rates a preset's compute is scaled from). `run.py plan=true` is harness.planning; the report's
projection is harness.report.projection.
"""
