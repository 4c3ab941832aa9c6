"""Core of the parallelism-strategy comparison harness: config, launcher, trainer, timing, memory, results."""
