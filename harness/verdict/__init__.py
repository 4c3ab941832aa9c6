"""Which combination is fastest, and how sure that is: intervals from rounds of fresh processes, ratios
paired by round, the racing that decides how many rounds each combination gets (docs/verdict.md)."""
