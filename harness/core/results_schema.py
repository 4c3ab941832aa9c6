"""results.schema.json, generated from the records in `harness.core.results`.

    python -m harness.core.results_schema          # write it beside results.py
    python -m harness.core.results_schema --check  # exit 1 when the shipped file is stale

The schema is of records as written (schema 2): every key present. pydantic generates it from the
dataclasses, so it cannot drift from them; the test suite checks each results.json it produces against it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from harness.core.results import SCHEMA, RunRecord

SCHEMA_PATH = Path(__file__).with_name("results.schema.json")


def generate() -> dict[str, Any]:
    from pydantic import TypeAdapter

    schema = TypeAdapter(RunRecord).json_schema(mode="serialization")
    schema["properties"]["schema"] = {"const": SCHEMA, "title": "Schema", "type": "integer"}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"urn:parallel-harness:results:v{SCHEMA}", **schema}  # 2020-12: an $id has no fragment


def text() -> str:
    return json.dumps(generate(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the shipped file instead of writing")
    args = parser.parse_args(argv)
    if args.check:
        if not SCHEMA_PATH.exists() or SCHEMA_PATH.read_text() != text():
            print(f"{SCHEMA_PATH} is stale: run python -m harness.core.results_schema", file=sys.stderr)
            return 1
        return 0
    SCHEMA_PATH.write_text(text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
