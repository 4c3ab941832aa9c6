"""Predictions before launch: each rank's peak memory and each iteration's time, for this machine or a
hardware preset, without training (docs/plan.md).

One job per module: `hardware` (the presets of conf/plan/hardware/, checked, and this machine's measured
one), `links` (the latency-bandwidth model of collectives, and its fit), `trace` (one rank's training step on
fake tensors: memory by kind at the peak, FLOPs), `calibrate` (this machine's measured compute), `predict` (a
combination's prediction from those), `output` (plan.json, the table, the comparison with a measurement),
`project` (a sweep's strategies projected onto presets, for the report).
"""
