"""How right the GPU projections are: the GPU operator model (harness/prediction/gpu_model.py) against every published
training result in harness/prediction/published.csv, each predicted by factors fitted without it (leave-one-out), and
the same prediction (a preset's, this machine's) taken on a quiet and on a loaded machine.

    python bench/projection.py [--write-results] [--fit]

`--fit` also writes the factors fitted to every case, with the leave-one-out band, to harness/prediction/gpu_factors.yaml
(what every GPU prediction uses); the shipped ones then come from `python bench/published_llm.py --fit`, which fits
them again with the language-model runs (the fused-attention factor among them) and keeps this band. Goals: median
|error| <= 15 % and every case within +-30 %, for images and for transformers apart; a prediction on a loaded machine within 10 % of the quiet one, or flagged busy.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import multiprocessing
import statistics
import sys
import time

import common

MEDIAN_GOAL, CASE_GOAL, LOAD_GOAL = 0.15, 0.30, 0.10
HELD_CASE_GOAL, BAND_Z = 0.35, 1.645  # issue 51's goal for held-out cases; the band's 90 % (harness.prediction.gpu_model)
QUICK_CASES = 6  # --quick: the first few rows (one workload), no band written


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def preset_prediction(overrides: list[str]) -> tuple[float, str | None]:
    """img/s the planner predicts for the overrides' combination on its preset (composed as run.py does), and
    why its calibration was flagged busy (None: not flagged, or nothing calibrated)."""
    from harness.launch.on_preset import predict_on  # noqa: PLC0415 (the harness, after the path common sets)
    from harness.prediction import calibrate  # noqa: PLC0415

    calibrate._calibrate.cache_clear()  # each call calibrates anew: the load at that moment is what is measured
    cfg = common.compose_config(overrides).run
    row = predict_on(cfg, cfg.plan.hardware, common.cores())
    calibrate.shutdown()
    if row["status"] != "predicted":
        raise common.BenchError(f"{' '.join(overrides)}: {row['status']}: {row.get('reason')}")
    return row["prediction"]["throughput_img_s"], row["prediction"].get("busy")


AMP_OF = {"tf32": "O0", "fp32": "O0", "amp": "O1", "fp16-o2": "O2"}  # the published precisions as amp levels


def published_fits(cases: list) -> tuple[common.Table, bool]:
    """Each published image configuration planned by the harness on its preset (plan=true, strategy=single, the
    harness's 8 synthetic batches on the device): every one trained, so every one must be predicted to fit."""
    from harness.launch.on_preset import predict_on  # noqa: PLC0415

    table = common.Table("memory: every published image configuration, planned on its preset (each trained: each must "
                         "fit)", ["case", "peak GiB", "of GiB", "allocator (limit / with room)", "fits", "goal"])
    seen: set[tuple] = set()
    met_all = True
    for c in cases:
        key = (c.workload, c.gpu, c.precision, c.batch_per_gpu)
        if c.seq_len or key in seen:
            continue
        seen.add(key)
        model = (["model=custom", f"model._target_=harness.prediction.published.{c.workload}"] if "resnext" in c.workload
                 else ["model=resnet50", f"model.name={c.workload}"])
        overrides = ["plan.enabled=true", f"plan.hardware={c.gpu}", "strategy=single", *model,
                     f"batch_size={c.batch_per_gpu}", f"amp={AMP_OF[c.precision]}",
                     f"data.image_size={380 if c.workload == 'efficientnet_b4' else 224}"]
        cfg = common.compose_config(overrides).run
        row = predict_on(cfg, c.gpu, common.cores())
        p = row.get("prediction") or {}
        trace = (p.get("calibration") or {}).get("trace") or {}
        fits = bool(p.get("fits"))
        met_all &= fits
        table.add(f"{c.workload} {c.gpu} {c.precision} b{c.batch_per_gpu}", f"{p.get('peak_mib', 0) / 1024:.1f}",
                  f"{p.get('device_memory_mib', 0) / 1024:.1f}",
                  f"{100 * trace.get('allocator_overhead', 0):.1f} % / {100 * trace.get('reserved_overhead', 0):.1f} %",
                  "yes" if fits else f"no: {p.get('misfit') or row.get('reason')}", common.verdict(fits))
    return table, met_all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fit", action="store_true", help="write the fitted factors to harness/prediction/gpu_factors.yaml")
    args = common.parse_args(parser, argv)
    from harness.prediction import gpu_model, published  # noqa: PLC0415

    cases = published.load_table()
    if args.quick:
        cases = cases[:QUICK_CASES]
    settings = {"cases": f"{len(cases)} published results (harness/prediction/published.csv)",
                "fit": "least squares on log(predicted / published), factors " +
                       ", ".join(published.fitted_parameters(False)),
                "band": "z 1.645 x the widest RMS of log errors: leave-one-out, architecture families held out, GPU types "
                        "held out",
                "load check": "a plan=true prediction on h100x8 and on this machine, quiet, then with both cores spinning "
                              "(goal: within 10 %, or the loaded one flagged busy)",
                "cores": common.cores(),
                "OMP_NUM_THREADS": "not set: the calibration in the load check sets a rank's thread count itself"}
    common.print_settings("GPU projections against published results", settings)
    started = time.perf_counter()
    factors, checks = published.leave_one_out(cases)
    # whole workload families and GPU types held out of the fit: what the model does where it was not fitted
    held = {"architecture family": published.leave_group_out(cases, published.family, factors),
            "GPU type": published.leave_group_out(cases, published.gpu_type, factors)}
    held_sd = {kind: published.log_rms([c for group in groups.values() for c in group]) for kind, groups in held.items()}
    loo_sd = factors.log_sd
    factors = dataclasses.replace(factors, log_sd=max(loo_sd, *held_sd.values()))  # the band: the widest of them
    fitted_s = time.perf_counter() - started
    table = common.Table("each published result, predicted by factors fitted without it",
                         ["case", "source", "published", "predicted (left out)", "band", "error", "fitted to all"])
    low, high = factors.band()
    for check in checks:
        c = check.case
        table.add(c.name, c.source, f"{c.published:g} {c.unit}", f"{check.left_out:.0f}",
                  f"{check.left_out * low:.0f}–{check.left_out * high:.0f}", f"{100 * check.error:+.1f} %",
                  f"{check.fitted:.0f}")
    table.print()
    summary = common.Table("leave-one-out errors by workload",
                           ["workload", "cases", "median |error|", "worst |error|", "within ±30 %", "goals"])
    met_all = True
    for workload in sorted({c.case.workload for c in checks}, key=list(published.WORKLOADS).index):
        errors = [abs(c.error) for c in checks if c.case.workload == workload]
        met = statistics.median(errors) <= MEDIAN_GOAL and max(errors) <= CASE_GOAL
        met_all &= met
        summary.add(workload, len(errors), f"{100 * statistics.median(errors):.1f} %", f"{100 * max(errors):.1f} %",
                    f"{sum(e <= CASE_GOAL for e in errors)}/{len(errors)}", common.verdict(met))
    summary.print()
    reach = BAND_Z * factors.log_sd
    held_table = common.Table("errors where the fit did not see the case, its architecture family or its GPU type",
                              ["held out", "cases", "median |error|", "worst |error|", "RMS of log errors",
                               "within the band", "goals (median ≤ 15 %, every case ≤ 35 %, band ≥ 80 %)"])

    def held_row(label: str, group: list[published.Check]) -> None:
        errors = [abs(c.error) for c in group]
        inside = sum(abs(math.log(c.left_out / c.case.published)) <= reach for c in group)
        met = statistics.median(errors) <= MEDIAN_GOAL and max(errors) <= HELD_CASE_GOAL and inside >= 0.8 * len(group)
        held_table.add(label, len(group), f"{100 * statistics.median(errors):.1f} %", f"{100 * max(errors):.1f} %",
                       f"{published.log_rms(group):.3f}", f"{inside}/{len(group)}", common.verdict(met))

    held_row("each case alone (leave-one-out)", checks)
    for kind, groups in held.items():
        for name, group in groups.items():
            held_row(f"{kind} {name}", group)
        if groups:  # --quick: one family on one GPU type leaves nothing to fit the rest on
            held_row(f"every {kind} in turn", [c for group in groups.values() for c in group])
    held_table.print()
    fitted = common.Table("the factors fitted to every case", ["factor", "value"])
    for name in (*published.fitted_parameters(False), "log_sd"):
        fitted.add(name, f"{getattr(factors, name):.4g}")
    fitted.print()

    if args.fit and not args.quick:
        header = ("# Written by `python bench/projection.py --fit`: harness/prediction/gpu_model.py's factors fitted to "
                  "every\n# case of harness/prediction/published.csv; log_sd is the band: the widest RMS of log errors of "
                  "leave-one-out,\n# architecture families held out and GPU types held out (benchmark 14).\n")
        gpu_model.write_factors(dataclasses.replace(
            factors, source=f"harness/prediction/published.csv, {len(cases)} cases, fitted {time.strftime('%Y-%m-%d')}"),
            header=header)
        print(f"wrote {gpu_model.FACTORS_FILE}", flush=True)
    load_table = common.Table("the same prediction, quiet and loaded (both cores spinning in other processes)",
                              ["case", "quiet img/s", "loaded img/s", "difference", "flagged busy", "goal"])
    cases_of_load = {
        "h100x8 (GPU model)": ["plan.enabled=true", "plan.hardware=h100x8", "strategy=ddp", "model=resnet50",
                               "batch_size=2048"],
        "local (calibrated here)": ["plan.enabled=true", "plan.hardware=local", "strategy=single", "model=tiny_cnn",
                                    "plan.calibration=model"]}
    if args.quick:
        cases_of_load = {"h100x8 (GPU model)": ["plan.enabled=true", "plan.hardware=h100x8", "strategy=ddp",
                                                "model=tiny_cnn", "batch_size=64"]}
    for label, overrides in cases_of_load.items():
        quiet, quiet_busy = preset_prediction(overrides)
        spinners = [multiprocessing.Process(target=spin, args=(120.0,)) for _ in range(common.cores())]
        for p in spinners:
            p.start()
        try:
            time.sleep(1.0)
            loaded, loaded_busy = preset_prediction(overrides)
        finally:
            for p in spinners:
                p.terminate()
        difference = loaded / quiet - 1
        met = abs(difference) <= LOAD_GOAL or (loaded_busy is not None and quiet_busy is None)
        load_table.add(label, f"{quiet:.0f}", f"{loaded:.0f}", f"{100 * difference:+.2f} %",
                       f"quiet: {'yes' if quiet_busy else 'no'}; loaded: {'yes' if loaded_busy else 'no'}",
                       common.verdict(met))
    load_table.print()
    if not args.quick:
        fits_table, _ = published_fits(cases)
        fits_table.print()
    print(f"leave-one-out over {len(cases)} cases took {fitted_s:.0f} s", flush=True)

    lines = [f"Every case's prediction in the second table comes from the factors fitted to the other {len(cases) - 1}: "
             "the error is what the model does on a figure it has not seen. The first table also holds out whole "
             "architecture families (ResNet, EfficientNet, BERT) and whole GPU types (every case of one, the fit made on "
             "the rest), what a user projecting "
             "another architecture or GPU meets. The band is the widest RMS of log errors of the three "
             f"(leave-one-out {loo_sd:.3f}, families held out {held_sd['architecture family']:.3f}, GPU types held out "
             f"{held_sd['GPU type']:.3f}), x1.645: x{low:.2f}–x{high:.2f}. A preset's compute is computed from the "
             "traced operators, not timed here, so this machine's load cannot move it; this machine's own prediction "
             "is calibrated here, and says so when other processes kept the cores busy meanwhile (the last table).",
             "", "Sources (full rows, commits and quotes in harness/prediction/published.csv): NVIDIA DeepLearningExamples "
             "ResNet-50 v1.5, ResNeXt-101 32x4d, SE-ResNeXt-101 32x4d, EfficientNet and BERT READMEs (PyTorch), "
             "lambdal/deeplearning-benchmark's PyTorch CSVs (data-centre and GDDR cards), this project's own GPU check."]
    bounded = [f"{name} {getattr(factors, name):g} (bounds {low_b:g}–{high_b:g})"
               for name, (low_b, high_b) in zip(published.PARAMETERS, published.BOUNDS, strict=True)
               if name in published.fitted_parameters(False)
               and any(math.isclose(getattr(factors, name), bound, rel_tol=1e-3) for bound in (low_b, high_b))]
    if bounded:
        lines += ["", "Factors the fit pushed to a bound (the published cases cannot tell them; read them as limits, "
                  "not measurements): " + "; ".join(bounded) + ". Every published case is a large batch, bound by the "
                  "GPU: the per-kernel costs show only in small steps, which the CPU's dispatch (an assumed "
                  f"{factors.dispatch_us:g} us per kernel, not fitted) bounds; the first lent GPU measures both "
                  "(scripts/gpu_check.sh)."]
    lines += ["", "A harness run on a GPU takes channels_last by default (kernels.channels_last); the projections "
              "follow the run's setting, NCHW where it was typed false."]
    if args.write_results:
        page = common.results_page("projection", settings, [held_table, summary, table, fitted, load_table], lines)
        common.write_results("projection", page, args.results_dir)
    return 0 if met_all or args.quick else 1


if __name__ == "__main__":
    sys.exit(main())
