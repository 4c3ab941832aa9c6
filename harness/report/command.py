"""`python -m harness.report FOLDER [FOLDER ...] [--out DIR] [--baseline strategy:amp]`: the report of every
run found under the folders, in a folder of its own."""

from __future__ import annotations

import argparse
import datetime as dt
import logging
from collections.abc import Sequence
from pathlib import Path

from harness.core.config import check_baseline_form
from harness.core.logs import setup_cli

log = logging.getLogger("harness.report")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, help="folders (searched recursively) or results.json files")
    parser.add_argument("--compare", nargs="*", type=Path, metavar="SWEEP",
                        help="two sweeps' folders, A then B: what differs, and B/A per row (prints; writes nothing)")
    parser.add_argument("--out", type=Path,
                        help="an empty or new folder to write to (default: runs/reports/<date_time>/)")
    parser.add_argument("--baseline", help="row the speedups are against, as strategy:amp (default single:O0)")
    parser.add_argument("--project", metavar="PRESETS",
                        help="hardware presets (conf/plan/hardware/) to project every row onto, e.g. h100x8,h100x16-ib")
    args = parser.parse_args(argv)
    setup_cli()
    if args.compare is not None:
        return _compare([*args.compare, *args.paths])
    if not args.paths:
        log.error("paths= is not allowed empty: give folders holding results.json files")
        return 2
    missing = [str(p) for p in args.paths if not p.exists()]
    if missing:
        log.error("paths=%s do not exist: give folders holding results.json files", ",".join(missing))
        return 2
    out = args.out or Path("runs") / "reports" / dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    if out.is_dir() and any(out.rglob("results.json")):  # a sweep's own folder keeps its own report
        log.error("--out=%s is not allowed: a folder of its own (it holds runs, whose report stays theirs)", out)
        return 2
    from harness.core.errors import ConfigError
    from harness.report.outputs import build_report

    presets = [p for p in (args.project or "").split(",") if p]
    try:  # checked before anything is written: a baseline no row can be, as the rows are built (strict)
        if args.project is not None:
            from harness.report.projection import check_presets

            if not presets:
                raise ConfigError("--project", args.project, "hardware presets, e.g. h100x8,h100x16-ib")
            check_presets(presets)
        if args.baseline is not None:
            check_baseline_form("--baseline", args.baseline)
        report = build_report(args.paths, out, args.baseline, project=presets, strict=True)
    except ConfigError as error:
        log.error("%s", error)
        return 2
    if not report.rows:
        log.error("no results.json found under %s", ", ".join(map(str, args.paths)))
        return 1
    return 0


def _compare(folders: Sequence[Path]) -> int:
    from harness.core.errors import ConfigError
    from harness.report.compare import compare, lines

    if len(folders) != 2:
        log.error("--compare=%s is not allowed: two sweeps' folders, A then B", " ".join(map(str, folders)) or "''")
        return 2
    missing = [str(p) for p in folders if not p.is_dir()]
    if missing:
        log.error("--compare=%s is not allowed: folders that exist, holding results.json files", ",".join(missing))
        return 2
    try:
        env, ratios = compare(*folders)
    except ConfigError as error:
        log.error("%s", error)
        return 2
    for line in lines(folders[0], folders[1], env, ratios):
        log.info("%s", line)
    return 0
