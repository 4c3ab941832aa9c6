"""What apex's opt levels O0-O3 mean: the level table, resolved for the accelerator in use.

`AmpConfig` is what the user wrote (conf/amp/, `amp.*` on the command line); `resolve` turns it into an
`AmpSpec` with every `auto` decided, which the amp plugins (how a level is *done*) then follow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from harness.core.defaults import from_env, hydra_defaults
from harness.core.errors import ConfigError

LEVELS = ("O0", "O1", "O2", "O3")
IMPLS = {"native": "amp.native.NativeAmp", "apex": "amp.apex.ApexAmp"}  # amp.impl -> the plugin class
HALF_DTYPES = ("float16", "bfloat16")
# amp.cpu_half: what the harness takes this CPU to have for half types. `auto`: what it has; `emulated`: no
# native kernels, on any host (O1-O3 skipped unless allow_emulated, and run on the kernels such a CPU takes);
# `native`: native kernels (O1-O3 run; a CPU without them still computes on emulated kernels)
CPU_HALF_MODES = ("auto", "native", "emulated")


@dataclass(frozen=True)
class AmpConfig:
    """What every amp level shares; each conf/amp/O*.yaml sets only `level` (the node the levels start from is
    `amp_defaults()`, composed as conf/amp's `_common`)."""

    level: str
    impl: str = "native"  # native: amp.native.NativeAmp, torch.autocast and GradScaler; apex: NVIDIA apex <= 25.05
    dtype: str = "auto"  # float16 | bfloat16 | auto (float16 on CUDA, bfloat16 on CPU)
    loss_scale: str | float = "auto"  # dynamic | a number | auto (the level's own; none for bfloat16)
    keep_batchnorm_fp32: bool | str = "auto"
    master_weights: bool | str = "auto"
    allow_emulated: bool = False  # time half precision on a CPU without native kernels for it anyway
    # one of CPU_HALF_MODES; HARNESS_CPU_HALF sets it for a whole session
    cpu_half: str = from_env("HARNESS_CPU_HALF", "auto")

    def __post_init__(self) -> None:
        _one_of("amp.level", self.level, LEVELS)
        _one_of("amp.impl", self.impl, tuple(IMPLS))
        _one_of("amp.dtype", self.dtype, (*HALF_DTYPES, "auto"))
        if self.loss_scale not in ("auto", "dynamic"):
            if isinstance(self.loss_scale, bool) or not isinstance(self.loss_scale, int | float) \
                    or not math.isfinite(self.loss_scale) or self.loss_scale <= 0:
                raise ConfigError("amp.loss_scale", self.loss_scale, "dynamic, auto or a positive number")
        for key in ("keep_batchnorm_fp32", "master_weights"):
            value = getattr(self, key)
            if not (isinstance(value, bool) or value == "auto"):
                raise ConfigError(f"amp.{key}", value, "true, false or auto")
        if not isinstance(self.allow_emulated, bool):
            raise ConfigError("amp.allow_emulated", self.allow_emulated, "true or false")
        _one_of("amp.cpu_half", self.cpu_half, CPU_HALF_MODES)


@dataclass(frozen=True)
class AmpSpec:
    """An amp level with every `auto` decided for the accelerator in use (apex's table, made explicit)."""

    level: str
    impl: str
    dtype: str  # the half type; "float32" for O0
    cast_model: bool  # O2/O3: the model's weights are half
    autocast: bool  # O1: per-op casting
    keep_batchnorm_fp32: bool
    master_weights: bool
    loss_scale: str | float  # "dynamic" or a static number; 1.0 means no scaling
    allow_emulated: bool = False
    cpu_half: str = "auto"

    @property
    def model_dtype(self) -> str:
        """The model's own dtype, its residual stream's: the half type where the level casts the model, else float32
        (autocast's half outputs are added back into a float32 stream)."""
        return self.dtype if self.cast_model else "float32"

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


TABLE: dict[str, dict[str, Any]] = {
    # level: cast_model, autocast, keep_batchnorm_fp32, master_weights, loss_scale (for float16)
    "O0": dict(cast_model=False, autocast=False, keep_batchnorm_fp32=True, master_weights=False, loss_scale=1.0),
    "O1": dict(cast_model=False, autocast=True, keep_batchnorm_fp32=True, master_weights=False, loss_scale="dynamic"),
    "O2": dict(cast_model=True, autocast=False, keep_batchnorm_fp32=True, master_weights=True, loss_scale="dynamic"),
    "O3": dict(cast_model=True, autocast=False, keep_batchnorm_fp32=False, master_weights=False, loss_scale=1.0),
}


def resolve(amp: AmpConfig, accelerator: str) -> AmpSpec:
    row = dict(TABLE[amp.level])
    dtype = amp.dtype if amp.dtype != "auto" else ("float16" if accelerator == "cuda" else "bfloat16")
    for key in ("keep_batchnorm_fp32", "master_weights"):
        value = getattr(amp, key)
        if value == "auto":
            continue
        if not row["cast_model"] and value != row[key]:
            raise ConfigError(f"amp.{key}", value, f"auto for {amp.level}; it only applies to O2 and O3")
        row[key] = value
    if amp.loss_scale != "auto":
        row["loss_scale"] = amp.loss_scale
    elif dtype == "bfloat16":
        row["loss_scale"] = 1.0  # bfloat16 has fp32's range: nothing to scale
    if amp.level == "O0":
        dtype, row["loss_scale"] = "float32", 1.0
    return AmpSpec(level=amp.level, impl=amp.impl, dtype=dtype, allow_emulated=amp.allow_emulated,
                   cpu_half=amp.cpu_half, **row)


def plugin_path(impl: str) -> str:
    """The `amp.impl` choice as the plugin class conf/amp/ names with `_target_` (the `amp_plugin` resolver)."""
    _one_of("amp.impl", impl, tuple(IMPLS))
    return IMPLS[impl]


def _one_of(key: str, value: object, allowed: tuple[object, ...]) -> None:
    if value not in allowed:
        raise ConfigError(key, value, "one of " + ", ".join(str(a) for a in allowed))


def amp_defaults() -> dict[str, Any]:
    """conf/amp's `_common`, which every level starts from: AmpConfig's defaults and the plugin class `impl`
    picks (`_target_`, resolved by harness.compose's `amp_plugin`)."""
    return {"_target_": "${amp_plugin:${.impl}}", **hydra_defaults(AmpConfig, skip=("level",))}
