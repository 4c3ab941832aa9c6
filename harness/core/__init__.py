"""The bottom layer: config records, errors, the amp level records, Placement and DeviceOps, timing windows,
logging set-up and optional-package checks. Everything else of the project may import it; it imports
nothing else of the project (checked by import-linter, pyproject.toml)."""
