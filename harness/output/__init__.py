"""The results file (results.py); what else came out of a run now lives with its feature or its side."""
