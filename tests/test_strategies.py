"""strategies.base: a strategy owns its set-up order. A plugin that must build its optimizer after wrapping
(tests/plugins/late_optimizer.py) needs nothing but its own class and options."""

from __future__ import annotations

import torch
from conftest import rank_spec

from harness.rank.worker import run_rank


def final_and_first_loss(tmp_path, target: str) -> tuple[float, float]:
    spec = rank_spec(tmp_path / "ranks", "single", strategy={"_target_": target, "scale": 2.0}, gpus=[],
                     nprocs=1, batch_size=8, iterations=60, log_every=20, warmup_windows=1,
                     data={"name": "synthetic", "image_size": 8, "num_classes": 10, "pool": 1})  # one batch: learnt
    threads = torch.get_num_threads()
    try:
        record = run_rank(spec)
    finally:
        torch.set_num_threads(threads)
    assert record["status"] == "ok"
    losses = [w["loss"] for w in record["windows"]]
    return losses[-1], losses[0]


def test_a_strategy_can_build_its_optimizer_after_wrapping(tmp_path):
    last, first = final_and_first_loss(tmp_path, "plugins.late_optimizer.LateOptimizer")
    assert last < 0.9 * first  # the parameters in use are the ones the optimizer steps


def test_the_order_matters_so_the_check_above_can_fail(tmp_path):
    last, first = final_and_first_loss(tmp_path, "plugins.late_optimizer.EarlyOptimizer")
    assert last == first  # the optimizer steps parameters the wrapper does not use: nothing trains


def test_its_options_are_checked_against_its_own_signature():
    import pytest
    from conftest import run_config

    from harness.core.errors import ConfigError

    assert run_config(strategy={"_target_": "plugins.late_optimizer.LateOptimizer", "scale": 3}).strategy["scale"] == 3
    with pytest.raises(ConfigError, match="strategy.scale=big is not allowed: a number"):
        run_config(strategy={"_target_": "plugins.late_optimizer.LateOptimizer", "scale": "big"})
