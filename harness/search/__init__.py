"""Search: the fastest configuration without running the grid (docs/search.md)."""
