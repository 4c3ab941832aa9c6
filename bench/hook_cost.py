"""What the common trainer adds per iteration: the cost of each call it makes that a bare loop does not.

    python bench/hook_cost.py [--write-results]

The trainer calls `before_step(it)` (stop request and fault injection), enters `amp.forward_context()`,
and goes through `amp.backward/step/zero_grad` where a bare loop calls `loss.backward()`,
`optimizer.step()` and `optimizer.zero_grad()` itself. Each is timed here with `timeit` against a no-op
target (a loss and an optimizer whose methods do nothing), so the figure is the harness's dispatch alone,
not the work it dispatches; the direct call to the same no-op target is timed beside it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import timeit
from typing import Any

import common
import torch

from amp import build_amp
from harness.core.amp_levels import AmpConfig, plugin_path, resolve
from harness.core.config import FaultConfig
from harness.core.stops import StopRequest
from harness.rank.worker import fault_injector


class NoOpLoss:
    def backward(self) -> None:
        pass


class NoOpOptimizer:
    param_groups: list[Any] = []

    def step(self) -> None:
        pass

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass


def per_call_us(stmt: Any, number: int, repeats: int) -> float:
    return statistics.median(timeit.repeat(stmt, number=number, repeat=repeats)) / number * 1e6


def bare_iteration_us(number: int, repeats: int) -> float:
    """One training iteration of tiny_cnn (8 px, batch 8) in a bare loop: what the added cost compares with."""
    import torch.nn.functional as F

    from harness.rank.models import TinyCNN

    torch.manual_seed(0)
    model = TinyCNN(num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images, labels = torch.randn(8, 3, 8, 8), torch.randint(0, 10, (8,))

    def step() -> None:
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(50):
        step()
    return per_call_us(step, max(number, 20), repeats)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args = common.parse_args(parser, argv)
    number, repeats = (2000, 3) if args.quick else (200_000, 9)
    torch.set_num_threads(common.cores())
    settings = {"calls per timing": number, "timings (median kept)": repeats, "precision": "O0 (fp32)",
                "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "not set"),
                "torch threads": torch.get_num_threads()}
    common.print_settings("Per-iteration cost of the trainer's own calls", settings)
    precision = build_amp(plugin_path("native"), resolve(AmpConfig(level="O0"), "cpu"), torch.device("cpu"))
    stop, inject = StopRequest(), fault_injector(FaultConfig(), rank=0, accelerator="cpu")

    def before_step(it: int) -> None:  # as harness.rank.worker builds it
        stop.check()
        inject(it)

    loss, optimizer = NoOpLoss(), NoOpOptimizer()

    def forward_context() -> None:
        with precision.forward_context():
            pass

    cases = [
        ("before_step(it): stop request + fault check", lambda: before_step(7), None),
        ("with amp.forward_context() (O0)", forward_context, None),
        ("amp.backward(loss) vs loss.backward()", lambda: precision.backward(loss), loss.backward),
        ("amp.step(opt) vs opt.step()", lambda: precision.step(optimizer), optimizer.step),
        ("amp.zero_grad(opt) vs opt.zero_grad(set_to_none=True)", lambda: precision.zero_grad(optimizer),
         lambda: optimizer.zero_grad(set_to_none=True)),
    ]
    table = common.Table("the trainer's calls, per call (µs; no-op targets: dispatch only)",
                         ["call", "through the harness µs", "direct µs", "added µs"])
    added = []
    with common.measure_load() as load:
        for name, harness, direct in cases:
            h = per_call_us(harness, number, repeats)
            d = per_call_us(direct, number, repeats) if direct else 0.0
            added.append(h - d)
            table.add(name, f"{h:.3f}", f"{d:.3f}" if direct else "—", f"{h - d:.3f}")
        iteration = bare_iteration_us(number // 100, repeats)
    total = sum(added)
    table.print()
    print(f"added per iteration: {total:.3f} µs, {100 * total / iteration:.2f} % of a bare tiny_cnn iteration "
          f"({iteration:.0f} µs; background load {load.background:.3f} cores)", flush=True)
    if args.write_results:
        lines = [f"- Every call the trainer makes that a bare loop does not adds {max(added):.2f} µs at most; "
                 f"together {total:.2f} µs per iteration: {100 * total / iteration:.2f} % of one iteration of the "
                 f"smallest model here (tiny_cnn, 8 px, batch 8: {iteration:.0f} µs in a bare loop), far less of a "
                 "real model's.",
                 "",
                 "How: `timeit` on each call with targets that do nothing (a loss whose backward returns at once, an "
                 "optimizer whose step and zero_grad do nothing), beside the direct call to the same target; the "
                 f"median of {repeats} timings of {number:,} calls. Background load {load.background:.3f} cores."]
        body = common.results_page("hook_cost", settings, [table], lines)
        common.write_results("hook_cost", body, args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
