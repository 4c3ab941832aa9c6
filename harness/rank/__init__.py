"""One rank's side of a run: its life and record (worker), the common training loop (trainer), its model and
data. The clock and the device operations it uses are in harness.core, shared with the parent's side."""
