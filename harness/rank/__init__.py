"""One rank's side of a run: its devices, its model and data, the common training loop and its clock."""
