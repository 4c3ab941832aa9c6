"""Memory in one place: the parent's sampler of the workers (sampler.py), the theoretical footprint a rank
computes (footprint.py) and the balance verdict across devices (imbalance.py)."""
