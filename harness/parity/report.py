"""The report's parity section, the parity feature's side: for every row that ran with `parity=true`, how far
its trained parameters and its loss curve are from the reference row's, and whether that is within what float
rounding explains. Built from the runs' records alone (this package never imports the report).

The reference is `strategy=single` at O0 (or, for rows that asked `parity.reference=same_amp`, at their own
amp level and dtype) on the same model, optimizer, data, seed, global batch and iterations (results.json's
`parity.fingerprint`). Judged, only where the comparison is fair: both in float32, no strategy option that
rounds the update on purpose (a compressed all-reduce), and the global batch cut into the same pieces for
batch-norm statistics. Everything else is reported with the reason it is not
judged, and what would make it judgeable."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from harness.core.results import PARAMETERS_NAME, Parity, RunRecord

# Judged rows must agree with the reference to this, relative: max |Δ| of a tensor over max |reference| of
# that tensor, the largest over tensors. Why 1e-4: float32 keeps 24 bits (eps 1.2e-7); a data-parallel
# strategy sums the same gradients in another order (per rank, then across ranks), which changes each step's
# update by a few eps, and the steps compound it: 7e-7 after 20 SGD steps of tiny_cnn, 1.2e-5 to 1.6e-5 after
# the default CPU run's 60 steps of tiny_cnn without batch-norm (docs/parity.md). A real defect (gradients summed
# instead of averaged, a rank's shard lost, a wrong learning rate) moves the parameters by 1e-3 or more after
# one step: 1e-4 sits a decade from each.
PARAM_RTOL = 1e-4

AGREES, DIFFERS, REPLICAS, REFERENCE = "agrees", "DIFFERS", "replicas differ", "reference"
BATCHNORM, MIXED, NO_REFERENCE = "batch-norm", "mixed precision", "no reference"
LOSSY = "lossy communication"
FAILED = (DIFFERS, REPLICAS)


@dataclass(frozen=True)
class Run:
    """What parity needs of one ok run: its results and its folder (where rank 0 left parameters.pt)."""

    results: RunRecord
    folder: Path

    @property
    def parity(self) -> Parity | None:
        return self.results.parity

    @property
    def dtype(self) -> str | None:
        return self.results.precision.dtype if self.results.precision else None


@dataclass(frozen=True)
class ParitySection:
    """A row's parity: the verdict, the row it was compared with, and the largest differences over its repeats."""

    verdict: str  # AGREES, DIFFERS, ... (the words above)
    reference: str | None = None  # the label of the row compared with
    note: str | None = None  # what the verdict means for this row, in words
    max_abs: float | None = None  # largest |parameter - reference's|, over tensors and repeats
    max_rel: float | None = None  # the same over the tensor's largest |reference value|
    loss_diff: float | None = None  # largest |loss - reference's loss| at the same iteration


class Labelled(Protocol):
    """What the parity notes read of a report's row: its label and its section (the report's Row is one)."""

    @property
    def label(self) -> str: ...

    @property
    def parity(self) -> ParitySection | None: ...


def sections(labels: Sequence[str], runs: Sequence[Sequence[Run]]) -> list[ParitySection | None]:
    """Each row's parity section (None: the row ran without parity); `labels[i]` names row i, `runs[i]` are its
    ok runs. A reference row is picked among the rows by the runs' own records: strategy, amp level, dtype."""
    candidates = [i for i in range(len(runs)) if _with_parity(runs[i])
                  and _with_parity(runs[i])[0].results.strategy == "single"]
    found: list[ParitySection | None] = []
    for i in range(len(runs)):
        mine = _with_parity(runs[i])
        if not mine:
            found.append(None)
            continue
        first = mine[0]
        reference = _pick_reference(i, runs, candidates, first)
        if reference is None:
            wanted = "at its own amp level" if first.parity.reference == "same_amp" else "at O0"
            said = ParitySection(NO_REFERENCE, None, f"no strategy=single row {wanted} ran with parity=true on the "
                                 "same model, optimizer, data, seed, global batch and iterations: add one to the sweep")
        elif reference == i:
            said = ParitySection(REFERENCE, labels[i], "the row the others are compared with")
        else:
            said = _compare(mine, labels[reference], _with_parity(runs[reference]))
        differing = sorted({rank for r in mine for rank in r.parity.differing_ranks or []})
        if differing:
            said = replace(said, verdict=REPLICAS, note=(
                f"rank{'s' if len(differing) > 1 else ''} {', '.join(map(str, differing))} ended with parameters "
                "different from rank 0's: replicas of one data-parallel run must be identical, so the strategy is "
                "defective. " + (said.note or "")))
        found.append(said)
    return found


def _with_parity(runs: Sequence[Run]) -> list[Run]:
    return [r for r in runs if r.parity]


def _pick_reference(i: int, runs: Sequence[Sequence[Run]], candidates: Sequence[int], first: Run) -> int | None:
    """The reference row for row i: a `single` row with the same fingerprint at the wanted amp level, with the
    same batch-norm split if there is one (so that the comparison can be judged), the row itself first."""
    same_amp = first.parity.reference == "same_amp"
    fitting = []
    for j in candidates:
        other = _with_parity(runs[j])[0]
        if other.parity.fingerprint != first.parity.fingerprint:
            continue
        if same_amp and (other.results.amp != first.results.amp or other.dtype != first.dtype):
            continue
        if not same_amp and (other.results.amp != "O0" or other.dtype != "float32"):
            continue
        fitting.append(j)
    pieces = _pieces(first)
    fitting.sort(key=lambda j: (_pieces(_with_parity(runs[j])[0]) != pieces, j != i,
                                _with_parity(runs[j])[0].parity.batchnorm_groups not in (None, 1)))
    return fitting[0] if fitting else None


def _pieces(run: Run) -> tuple[int | None, str | None]:
    """How the run cuts each global batch for batch-norm: how many pieces, and how (results.json from before
    `batchnorm_split` have none: consecutive, as they then were unless data=loader)."""
    groups = run.parity.batchnorm_groups
    return groups, run.parity.batchnorm_split or ("consecutive" if groups not in (None, 1) else None)


def _compare(mine: Sequence[Run], reference: str, theirs: Sequence[Run]) -> ParitySection:
    """Largest differences over the row's runs (repeats) against the reference's first run, and the verdict."""
    ref = theirs[0]
    ref_params = _parameters(ref)
    abs_diffs, rel_diffs, loss_diffs = [], [], []
    for run in mine:
        params = _parameters(run)
        if params is not None and ref_params is not None:
            if set(params) != set(ref_params) or any(params[k].shape != ref_params[k].shape for k in params):
                return ParitySection(DIFFERS, reference, "its parameters do not have the reference's names and shapes")
            abs_diffs.append(max((params[k] - ref_params[k]).abs().max().item() for k in params))
            rel_diffs.append(max(_relative(params[k], ref_params[k]) for k in params))
        ours, base = run.parity.losses or [], ref.parity.losses or []
        if ours and base:
            loss_diffs.append(max(abs(a - b) for a, b in zip(ours, base, strict=False)))
    max_abs = max(abs_diffs) if abs_diffs else None
    max_rel = max(rel_diffs) if rel_diffs else None
    loss_diff = max(loss_diffs) if loss_diffs else None
    if max_rel is None:
        return ParitySection(NO_REFERENCE, reference, f"{PARAMETERS_NAME} is missing from this run's or the "
                             "reference's folder: parameters cannot be compared (the loss curves can)", max_abs,
                             max_rel, loss_diff)
    first = mine[0]
    groups, ref_groups = first.parity.batchnorm_groups, ref.parity.batchnorm_groups
    lossy = first.parity.lossy or ref.parity.lossy
    if first.dtype != "float32" or ref.dtype != "float32":
        verdict, note = MIXED, (f"computes in {first.dtype} against a {ref.dtype} reference: the drift is reported, "
                                "not judged (half precision rounds to 8 or 11 bits, so no float32 tolerance applies)")
    elif lossy:
        # Not judged: a compressed all-reduce rounds every gradient to 11 (fp16) or 8 (bf16) bits each step
        # (PowerSGD sends a low-rank approximation), and 20 steps compound that by an amount no float32
        # tolerance bounds; the drift is what such a row is run to show.
        verdict, note = LOSSY, (f"not judged: lossy communication ({lossy}), so the update is inexact by design and "
                                "no float32 tolerance applies; the drift is reported")
    elif _pieces(first) != _pieces(ref):
        verdict, note = BATCHNORM, batchnorm_note(groups, ref_groups, first.parity.batchnorm_split)
    elif max_rel <= PARAM_RTOL and not math.isnan(max_rel):
        verdict, note = AGREES, f"within float32 rounding (max relative difference ≤ {PARAM_RTOL:g})"
    else:
        verdict, note = DIFFERS, (f"max relative parameter difference {max_rel:.1e} > {PARAM_RTOL:g}: more than "
                                  "float32 rounding explains; this strategy does not compute the update of one "
                                  "device on the whole batch")
    return ParitySection(verdict, reference, note, max_abs, max_rel, loss_diff)


def batchnorm_note(groups: int | None, ref_groups: int | None, split: str | None = None) -> str:
    """Why a batch-norm row differs from its reference, and the comparison that removes the difference."""
    pieces = groups or 1
    if split == "interleaved":
        return (f"batch-norm normalises each global batch in {pieces} pieces here, and they are interleaved "
                "positions of the batch (data=loader's DistributedSampler gives rank r of N the positions r, r+N, "
                "...; or synchronized batch-norm normalises the ranks' k-th micro-batches together), not the "
                "consecutive slices a reference cuts: reported, not judged. For a strict check use data=synthetic "
                "or a model without batch-norm (model=tiny_cnn model.norm=none)")
    return (f"batch-norm normalises each global batch in {pieces} piece{'s' if pieces > 1 else ''} here (one per "
            f"rank or replica, times grad_accum's micro-batches) and in {ref_groups or 1} in the reference, so the "
            "update legitimately differs: reported, not judged. For a strict check use a model without batch-norm "
            "(model=tiny_cnn "
            "model.norm=none), synchronized batch-norm where the backend has it (CUDA: strategy=ignite "
            "strategy.sync_bn=true), or the reference with the same split (strategy=single "
            f"strategy.batchnorm_shards={pieces})")


def _relative(values: Any, reference: Any) -> float:
    scale = reference.abs().max().item()
    diff = (values - reference).abs().max().item()
    return diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)


def _parameters(run: Run) -> dict[str, Any] | None:
    """The run's parameters.pt (torch is imported only when a report has one to read)."""
    path = run.folder / PARAMETERS_NAME
    if not path.is_file():
        return None
    from harness.parity.rank import load_parameters

    return load_parameters(path)


def cell(found: ParitySection | None) -> str:
    """The table's parity cell: verdict and max relative parameter difference."""
    if found is None:
        return "—"
    figure = f" {found.max_rel:.1e}" if found.max_rel is not None else ""
    return f"{'✗ ' if found.verdict in FAILED else ''}{found.verdict}{figure}"


def notes(rows: Sequence[Labelled]) -> list[str]:
    """One line per row with a parity verdict: its figures and what the verdict means (a meaning already
    given for an earlier row is referred to, not repeated)."""
    lines: list[str] = []
    said: dict[str | None, str] = {}
    for row in rows:
        found = row.parity
        if found is None:
            continue
        note = f"as for {said[found.note]}" if found.note in said else found.note
        said.setdefault(found.note, row.label)
        figures = "; ".join(f"{name} {value:.2e}" for name, value in (
            ("max abs Δ", found.max_abs), ("max rel Δ", found.max_rel), ("max loss Δ", found.loss_diff))
            if value is not None)
        against = f" vs {found.reference}" if found.reference and found.verdict != REFERENCE else ""
        lines.append(f"{row.label}: {cell(found)}{against}" + (f" ({figures})" if figures else "") + f": {note}")
    return lines


def summary(rows: Sequence[Labelled]) -> str | None:
    """The parity sentence of the verdict: what agrees, what does not, what is not judged and why."""
    judged = [(r.label, r.parity) for r in rows if r.parity is not None]
    if not judged:
        return None
    by: dict[str, list[str]] = {}
    for label, found in judged:
        by.setdefault(found.verdict, []).append(label)
    reference = next((f.reference for _, f in judged if f.reference and f.verdict != REFERENCE), None)
    parts = []
    if AGREES in by:
        parts.append(f"{', '.join(by[AGREES])} agree{'s' if len(by[AGREES]) == 1 else ''} with it within float32 "
                     f"rounding (relative {PARAM_RTOL:g})")
    for verdict, words in ((DIFFERS, "DIFFER beyond float32 rounding"), (REPLICAS, "have replicas that differ"),
                           (BATCHNORM, "differ because batch-norm sees shards (explained, not judged)"),
                           (MIXED, "use mixed precision (drift reported, not judged)"),
                           (LOSSY, "use lossy communication (drift reported, not judged)")):
        if verdict in by:
            parts.append(f"{', '.join(by[verdict])} {words}")
    sentences = [f"Parity against {reference}: " + "; ".join(parts) + "."] if reference and parts else []
    if NO_REFERENCE in by:
        sentences.append(f"Parity: {', '.join(by[NO_REFERENCE])} have no reference row (strategy=single at O0, or "
                         "at the row's amp level with parity.reference=same_amp; same model, data, seed, batch and "
                         "iterations; parity=true): nothing to compare with.")
    return " ".join(sentences) or None
