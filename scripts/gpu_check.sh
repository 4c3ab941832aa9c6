#!/usr/bin/env bash
# The GPU check, in one command on a GPU machine with torch installed:  bash scripts/gpu_check.sh [OUT_DIR]
# Packages the machine lacks come from .whl/ (made by scripts/gpu_wheels.sh where there is network), else
# from the package index. If apex-src/ holds NVIDIA apex's source at tag 25.05, it is built python-only
# first. Writes OUT_DIR/gpu-check.md (default runs/gpu-check/<time>/), the JUnit XML and the full log.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/gpu-check/$(date +%Y-%m-%d_%H-%M-%S)}
mkdir -p "$out"
py=${PYTHON:-python3}
site=$(mktemp -d)
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
commit=$(git rev-parse --short HEAD 2>/dev/null || echo "${HARNESS_COMMIT:-unknown}")

missing=$("$py" - <<'PY'
import importlib.util
need = {"hydra": "hydra-core", "omegaconf": "omegaconf", "psutil": "psutil", "pynvml": "nvidia-ml-py",
        "rich": "rich", "matplotlib": "matplotlib", "pytest": "pytest"}
print(" ".join(pkg for mod, pkg in need.items() if importlib.util.find_spec(mod) is None))
PY
)
if ls .whl/*.whl >/dev/null 2>&1; then
    echo "installing carried wheels into $site: $(ls .whl | tr '\n' ' ')"
    "$py" -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl || exit 1
elif [ -n "$missing" ]; then
    echo "installing from the package index: $missing"
    "$py" -m pip install -q --target "$site" $missing || exit 1
fi
if [ -d apex-src ] && ! "$py" -c "import apex.amp" 2>/dev/null; then
    echo "building NVIDIA apex python-only from apex-src/ (no --cpp_ext/--cuda_ext: no compiler needed)"
    "$py" -m pip install -q --no-build-isolation --no-deps --no-index --target "$site" ./apex-src \
        >"$out/apex-build.log" 2>&1 || echo "apex build failed: see $out/apex-build.log (apex tests will skip)"
fi
nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true
# GPU_CHECK_SELECT="words": only the tests whose names match (pytest -k), e.g. to rerun what failed
"$py" -m pytest tests/gpu -m gpu -v -rs -p no:cacheprovider -o junit_family=xunit1 --junitxml="$out/junit.xml" \
    ${GPU_CHECK_SELECT:+-k "$GPU_CHECK_SELECT"} 2>&1 | tee "$out/pytest.log"
status=${PIPESTATUS[0]}
"$py" scripts/gpu_summary.py "$out/junit.xml" "$out/gpu-check.md" "$commit"
# the GPU model's predictions against this GPU (rows to append to harness/prediction/published.csv, then refit)
"$py" scripts/gpu_projection.py "$out" 2>&1 | tee "$out/gpu-projection.log"
echo "GPU check: $out/gpu-check.md (pytest exit $status)"
exit "$status"
