"""Which amp levels each strategy runs, from the strategies' own rules (`Strategy.amp_rules`), as the table
in docs/strategies.md (generated here, checked by the tests):

    python -m strategies.compat           # print the table
    python -m strategies.compat --write   # put it into docs/strategies.md, between its markers

The strategies are those conf/strategy/*.yaml name, so a strategy added with its file and its yaml is in
the table with nothing else touched.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.core.amp_levels import LEVELS, AmpConfig, resolve
from strategies.base import AmpRule, Strategy

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "strategies.md"
BEGIN, END = "<!-- compat-table: python -m strategies.compat --write -->", "<!-- /compat-table -->"
COLUMNS = (("native", "float16"), ("native", "bfloat16"), ("apex", "float16"))  # apex casts to float16 only


def strategy_classes(conf: Path = REPO / "conf" / "strategy") -> dict[str, type[Strategy]]:
    """Every strategy the configs offer, by the name `strategy=` takes."""
    from hydra.utils import get_class
    from omegaconf import OmegaConf

    from harness.core.options import option_target

    return {path.stem: get_class(str(option_target(OmegaConf.load(path)))) for path in sorted(conf.glob("*.yaml"))}


def refusal(cls: type[Strategy], impl: str, dtype: str, level: str) -> AmpRule | None:
    """The rule that refuses this level (at its default options, on GPUs), if one does."""
    spec = resolve(AmpConfig(level=level, impl=impl, dtype=dtype), "cuda")
    return next((rule for rule in cls.amp_rules if rule.matches(spec)), None)


def table(classes: dict[str, type[Strategy]] | None = None) -> str:
    """Markdown: per strategy and amp implementation/dtype, the levels it runs at their defaults; below, each
    refusal and what to use instead."""
    classes = classes if classes is not None else strategy_classes()
    head = "| strategy | " + " | ".join(f"{impl} {dtype}" for impl, dtype in COLUMNS) + " |"
    lines = [head, "|---" * (len(COLUMNS) + 1) + "|"]
    refusals: dict[tuple[str, str, str], tuple[AmpRule, list[str]]] = {}
    for name, cls in classes.items():
        cells = []
        for impl, dtype in COLUMNS:
            runs = []
            for level in LEVELS:
                rule = refusal(cls, impl, dtype, level)
                if rule is None:
                    runs.append(level)
                    continue
                value = getattr(resolve(AmpConfig(level=level, impl=impl, dtype=dtype), "cuda"), rule.key)
                refusals.setdefault((name, f"amp.{rule.key}={value}", f"{impl} {dtype}"), (rule, []))[1].append(level)
            cells.append(" ".join(runs) or "—")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Each refusal, at its levels, and what the refusal's line says to use instead:", ""]
    lines += [f"- {name}, {what} ({column}: {', '.join(levels)}): {rule.allowed.format(level='/'.join(levels), dtype=column.split()[1])}"
              for (name, what, column), (rule, levels) in refusals.items()]
    return "\n".join(lines) + "\n"


def docs_block(doc: str) -> str:
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    return doc[start:end].strip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write the table into {DOC.relative_to(REPO)}")
    args = parser.parse_args(argv)
    text = table()
    if not args.write:
        sys.stdout.write(text)
        return 0
    doc = DOC.read_text()
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    DOC.write_text(doc[:start] + "\n" + text + doc[end:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
