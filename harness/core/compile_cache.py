"""Where compile=true keeps inductor's compiled graphs and kernels, and whether a run found them there.

Left to itself, inductor writes to /tmp/torchinductor_<user> (torch/_inductor/runtime/cache_dir_utils.py,
`default_cache_dir`): hundreds of MB outside the project, and a run that finds it full compiles in a
fraction of the time of one that finds it empty. The harness names the folder instead (`runs/compile-cache`,
or TORCHINDUCTOR_CACHE_DIR where the user set one; Triton's kernels go under it too, as inductor puts them
unless TRITON_CACHE_DIR is set) and records whether it held anything before the run (`compile_cache.warm`
in results.json), since compile_seconds depends on it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

DEFAULT = Path("runs") / "compile-cache"
ENV = "TORCHINDUCTOR_CACHE_DIR"


def torch_default() -> Path:
    """inductor's own choice. Importing torch._dynamo already exports it (torch/_dynamo/package.py calls
    cache_dir(), which sets `os.environ["TORCHINDUCTOR_CACHE_DIR"]`): finding it there says nothing of the user."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return Path(default_cache_dir()).absolute()


def use_compile_cache() -> Path:
    """The cache folder, made absolute and exported to this process's environment, so inductor (and the
    workers and compile subprocesses started after this) use it: TORCHINDUCTOR_CACHE_DIR where it names a
    folder of the user's, else runs/compile-cache."""
    chosen = os.environ.get(ENV)
    path = Path(chosen).absolute() if chosen and Path(chosen).absolute() != torch_default() else DEFAULT.absolute()
    path.mkdir(parents=True, exist_ok=True)
    os.environ[ENV] = str(path)
    return path


def prepare_compile_cache() -> dict[str, Any]:
    """In the parent, before any worker starts: the folder, and whether it was warm (held any file)."""
    path = use_compile_cache()
    warm = any(f.is_file() for f in path.rglob("*"))
    return {"dir": str(path), "warm": warm}
