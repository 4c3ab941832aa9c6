"""What comes out of a run: the results file, the terminal and log lines, the memory-balance verdict and
the sweep's report callback."""
