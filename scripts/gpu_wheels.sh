#!/usr/bin/env bash
# Where there is network: put into .whl/ the pure-Python packages a GPU machine with torch preinstalled may
# lack (the harness's own dependencies and pytest-free extras), for scripts/gpu_check.sh to install offline.
#     bash scripts/gpu_wheels.sh [APEX_GIT]
# With APEX_GIT (a clone URL or a local git directory of NVIDIA/apex), also export its tag 25.05 into
# apex-src/ for a python-only build there. .whl/ and apex-src/ are git-ignored: carry them with the copy.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir .whl
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl \
    "hydra-core>=1.3,<1.4" "omegaconf>=2.3,<2.4" "pytorch-ignite>=0.5"
python3 -m pip wheel -q --no-deps -w .whl "antlr4-python3-runtime==4.9.*"  # published as a source archive only
# pydantic's compiled core, for the GPU image's Python (3.12 on x86-64), which has no pydantic
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    "pydantic>=2.6" pydantic-core annotated-types typing-inspection "typing-extensions>=4.14" \
    jsonschema jsonschema-specifications referencing rpds-py  # the suite's check of every results.json
ls -l .whl
if [ $# -ge 1 ]; then
    rm -rf apex-src && mkdir apex-src
    if [ -d "$1" ]; then
        git --git-dir="$1" archive 25.05 | tar -x -C apex-src
    else
        git clone --quiet --branch 25.05 --depth 1 "$1" apex-src
    fi
    echo "apex-src/: NVIDIA apex 25.05 ($(du -sh apex-src | cut -f1))"
fi
