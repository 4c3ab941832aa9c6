"""`search.json` in a search's folder: the space, what the predictions pruned and why, what was raced, and the
search's own cost; written by the rounds sweeper when the search starts and ends, read by the report. The runs'
results.json files cannot say what was never run: this file does."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

NAME = "search.json"


@dataclass
class PrunedEntry:
    name: str  # as the report labels the combination
    overrides: list[str]
    reason: str
    predicted_s_per_iteration: float | None = None


@dataclass
class SearchRecord:
    space: int  # combinations in the space
    kept: list[list[str]]  # the candidates raced: their overrides
    kept_names: list[str]
    pruned: list[PrunedEntry] = field(default_factory=list)
    predicted_s_per_iteration: dict[str, float] = field(default_factory=dict)  # by name, every predicted candidate
    axes: list[str] = field(default_factory=list)
    prune_factor: float = 2.0
    budget_s: float = 0.0
    command: str = ""  # as typed
    started_at: float | None = None
    ended_at: float | None = None
    runs: int = 0
    rounds: int = 0
    ended_by: str = ""

    def write(self, folder: Path) -> None:
        path = folder / NAME
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(asdict(self), indent=1))
        temporary.replace(path)


def read_search(folders: list[Path]) -> SearchRecord | None:
    """The record of a report over exactly one search's folder; None for anything else."""
    paths = [folder / NAME for folder in folders if (folder / NAME).is_file()]
    if len(paths) != 1 or len(folders) != 1:
        return None
    try:
        data = json.loads(paths[0].read_text())
        data["pruned"] = [PrunedEntry(**p) for p in data.get("pruned") or []]
        return SearchRecord(**data)
    except (OSError, ValueError, TypeError):
        return None
