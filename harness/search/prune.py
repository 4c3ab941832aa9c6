"""Prune by prediction: what is predicted not to fit, or predicted slower than the best prediction by more than
`factor` even at the optimistic end of its band, is not run; each is listed with the prediction that pruned it.
A combination without a prediction (none could be made) is never pruned: only a measurement can judge it."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from harness.prediction.predict import Prediction


@dataclass(frozen=True)
class Pruned:
    key: Hashable
    reason: str


def per_sample_s(prediction: Prediction) -> float:
    """Seconds per sample of the global batch: what compares combinations whose batches differ."""
    return prediction.s_per_iteration / max(1, prediction.global_batch)


def prune(predictions: Mapping[Hashable, Prediction | None], factor: float,
          labels: Mapping[Hashable, str]) -> tuple[list[Hashable], list[Pruned]]:
    """(kept, pruned), each in the order given. Slower is judged against the best predicted time per sample of
    the combinations predicted to fit, with each candidate at the fast end of its band (`time_band[0]`), so a
    combination is pruned only where even its optimistic prediction is `factor` times the best one's."""
    fitting = {k: p for k, p in predictions.items() if p is not None and p.fits}
    best_key = min(fitting, key=lambda k: per_sample_s(fitting[k]), default=None)
    kept: list[Hashable] = []
    pruned: list[Pruned] = []
    for key, prediction in predictions.items():
        if prediction is None:
            kept.append(key)
        elif not prediction.fits:
            pruned.append(Pruned(key, f"predicted not to fit: {prediction.misfit()}"))
        elif best_key is not None and key != best_key:
            best = per_sample_s(fitting[best_key])
            optimistic = per_sample_s(prediction) * prediction.time_band[0]
            if optimistic > factor * best:
                pruned.append(Pruned(key, f"predicted {per_sample_s(prediction) / best:.1f}x the time per sample of "
                                          f"{labels.get(best_key, str(best_key))} (at best {optimistic / best:.1f}x, "
                                          f"the fast end of its band; search.prune_factor={factor:g})"))
            else:
                kept.append(key)
        else:
            kept.append(key)
    return kept, pruned
