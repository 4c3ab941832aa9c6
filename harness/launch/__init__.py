"""The launching process's side of a run: plan it, start its workers, sample their memory, merge their
records into results (or, under torchrun, be one of the workers and gather to rank 0)."""
