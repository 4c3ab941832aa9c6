"""strategies.compat: strategy x amp implementation x dtype, one table from the strategies' own rules, which
are also what refuses a run; docs/strategies.md's copy is checked here."""

from __future__ import annotations

import pytest

from harness.core.amp_levels import AmpConfig, resolve
from harness.core.devices import Placement
from harness.core.errors import Incompatible
from strategies import compat

GPUS = Placement("cuda", (0, 1), (0, 1), 2, True, ("cuda:0", "cuda:1"), 1, 32)


def test_the_docs_table_is_the_one_the_rules_give():
    assert compat.docs_block(compat.DOC.read_text()) == compat.table(), \
        "docs/strategies.md's table is stale: run python -m strategies.compat --write"


@pytest.mark.parametrize("strategy, impl, dtype, level, options, refused", [
    # worked out from each strategy's reasons (and seen the same on the code before the table: 640
    # combinations of strategy, impl, dtype, level and options gave the same lines)
    ("dp", "apex", "float16", "O2", {}, "amp.impl=apex is not allowed: native with strategy=dp at O2"),
    ("dp", "apex", "float16", "O1", {}, None),  # apex patches torch functions at O1, not the forward
    ("apex_ddp", "native", "bfloat16", "O2", {}, "amp.dtype=bfloat16 is not allowed: float16 with strategy=apex_ddp"),
    ("apex_ddp", "native", "bfloat16", "O1", {}, None),  # the weights stay fp32
    ("fsdp", "apex", "float16", "O0", {}, "amp.impl=apex is not allowed: native with strategy=fsdp"),
    ("horovod", "native", "float16", "O1", {}, "amp.loss_scale=dynamic is not allowed: a fixed scale"),
    ("horovod", "native", "float16", "O1", {"loss_scale": 1024.0}, None),
    ("horovod", "native", "bfloat16", "O2", {}, None),  # bfloat16: nothing to scale
    ("xla", "apex", "float16", "O0", {}, None),  # O0 is fp32 whatever the implementation
    ("xla", "apex", "float16", "O3", {}, "amp.impl=apex is not allowed: native with strategy=xla"),
    ("zero", "apex", "float16", "O2", {}, "amp.impl=apex is not allowed: native with strategy=zero at O2"),
    ("zero", "apex", "float16", "O2", {"master_weights": False}, None),
    ("zero", "apex", "float16", "O3", {"master_weights": True}, "amp.impl=apex is not allowed: native with strategy=zero at O3"),
    ("ddp", "apex", "float16", "O2", {}, None),
])
def test_a_rule_refuses_exactly_its_combinations(strategy, impl, dtype, level, options, refused):
    cls = compat.strategy_classes()[strategy]
    spec = resolve(AmpConfig(level=level, impl=impl, dtype=dtype, **options), "cuda")
    if refused is None:
        cls.check_compatible(GPUS, spec)
        return
    with pytest.raises(Incompatible) as caught:
        cls.check_compatible(GPUS, spec)
    assert str(caught.value).startswith(refused)


def test_a_strategy_added_with_its_file_and_yaml_is_in_the_table(tmp_path):
    """The test plugin (tests/plugins/late_optimizer.py) with a yaml of its own: its rule is in the table."""
    (tmp_path / "late.yaml").write_text("_target_: plugins.late_optimizer.LateOptimizer\nscale: 2.0\n")
    (tmp_path / "ddp.yaml").write_text("_target_: strategies.ddp.TorchDDP\n")
    text = compat.table(compat.strategy_classes(tmp_path))
    assert "| late | O0 | O0 | O0 |" in text and "| ddp | O0 O1 O2 O3 | O0 O1 O2 O3 | O0 O1 O2 O3 |" in text
    assert "- late, amp.level=O3 (native float16: O3): O0 for this test strategy" in text
