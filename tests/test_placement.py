"""harness.launch.placement: GPU ids to CUDA_VISIBLE_DEVICES and rank->device maps, checked without any GPU."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import run_config

from harness.core.devices import Placement
from harness.core.errors import ConfigError
from harness.launch.placement import (
    Hardware,
    place,
    place_workers,
    probe_hardware,
    usable_cores,
    visible_gpus,
)

FOUR_GPUS = Hardware(visible_gpus=(0, 1, 2, 3), cores=16)
NO_GPU = Hardware(visible_gpus=(), cores=2)


def place_as(cfg, hw, layout):
    one_per_device, drives_all, needs_cuda = {
        "per_device": (True, False, False),  # DDP
        "one": (False, False, False),  # single
        "all": (False, True, True),  # DataParallel
    }[layout]
    return place(cfg, hw, one_process_per_device=one_per_device, drives_all_devices=drives_all,
                 needs_cuda=needs_cuda)


def test_gpus_013_one_process_per_device():
    p = place(run_config("ddp", gpus=[0, 1, 3]), FOUR_GPUS, one_process_per_device=True,
              drives_all_devices=False, needs_cuda=False)
    assert p.accelerator == "cuda"
    assert p.worker_env["CUDA_VISIBLE_DEVICES"] == "0,1,3"
    assert p.worker_env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert p.devices == ("cuda:0", "cuda:1", "cuda:3")
    # each worker sees only the chosen GPUs (CUDA_VISIBLE_DEVICES), numbered 0..2 inside it
    assert p.gpus == (0, 1, 3) and p.torch_indices == (0, 1, 2)
    assert p.nprocs == 3 == p.world_size
    assert [p.rank_device(r) for r in range(3)] == ["cuda:0", "cuda:1", "cuda:3"]
    assert p.rank_device(2) == "cuda:3"
    assert p.local_batch == 4 and p.global_batch == 12
    assert p.threads_per_process == 5 and p.worker_env["OMP_NUM_THREADS"] == "5"
    assert p.notes == ()


def test_gpus_among_already_narrowed_visible_devices():
    """The user ran with CUDA_VISIBLE_DEVICES=2,3,5: torch sees 0,1,2, the ids stay physical."""
    ids, tokens = visible_gpus("2,3,5", 3)
    hw = Hardware(visible_gpus=ids, cores=8, tokens=tokens)
    p = place_as(run_config("ddp", gpus=[3, 5], batch_size=8), hw, "per_device")
    assert p.worker_env["CUDA_VISIBLE_DEVICES"] == "3,5"
    assert p.devices == ("cuda:3", "cuda:5")
    assert p.torch_indices == (0, 1)  # inside the workers, which see only GPUs 3 and 5
    inline = place(run_config("single", gpus=[3, 5], batch_size=8), hw, one_process_per_device=False,
                   drives_all_devices=True, needs_cuda=True, isolated=False)
    assert inline.torch_indices == (1, 2)  # in this process, which sees 2,3,5 as 0,1,2


def test_one_process_strategy_uses_the_first_gpu_with_a_note():
    p = place_as(run_config("single", gpus=[0, 1, 3]), FOUR_GPUS, "one")
    assert p.devices == ("cuda:0",) and p.gpus == (0,)
    assert p.nprocs == 1 and p.local_batch == 12
    assert p.worker_env["CUDA_VISIBLE_DEVICES"] == "0"
    assert "OMP_NUM_THREADS" not in p.worker_env  # runs inside the launcher
    assert p.rank_device(0) == "cuda:0"
    assert len(p.notes) == 1 and "one device" in p.notes[0] and "[0, 1, 3]" in p.notes[0]


def test_drives_all_devices_is_one_process_over_all_gpus():
    p = place_as(run_config("single", gpus=[0, 1, 3]), FOUR_GPUS, "all")
    assert p.devices == ("cuda:0", "cuda:1", "cuda:3")
    assert p.nprocs == 1 and p.local_batch == 12
    assert p.worker_env["CUDA_VISIBLE_DEVICES"] == "0,1,3"
    assert p.rank_device(0) == "cuda:0"  # the base device


def test_gpus_null_takes_every_visible_gpu():
    p = place_as(run_config("ddp", gpus=None, batch_size=8), FOUR_GPUS, "per_device")
    assert p.devices == ("cuda:0", "cuda:1", "cuda:2", "cuda:3") and p.nprocs == 4


@pytest.mark.parametrize("gpus", [[0, 4], [7]])
def test_gpus_beyond_the_visible_ones_are_refused(gpus):
    with pytest.raises(ConfigError) as info:
        place_as(run_config("ddp", gpus=gpus), FOUR_GPUS, "per_device")
    assert info.value.key == "gpus"
    assert "[0, 1, 2, 3]" in info.value.allowed


def test_gpus_on_a_machine_without_gpus_are_refused():
    with pytest.raises(ConfigError) as info:
        place_as(run_config("ddp", gpus=[0]), NO_GPU, "per_device")
    assert info.value.key == "gpus" and "no visible GPU" in str(info.value)


def test_a_cuda_only_strategy_refuses_an_empty_gpu_list():
    with pytest.raises(ConfigError) as info:
        place_as(run_config("single", gpus=[]), FOUR_GPUS, "all")
    assert info.value.key == "gpus" and "gpus=[0,1]" in str(info.value)


def test_a_cuda_only_strategy_on_a_machine_without_gpus_says_so_not_which_ids_to_give():
    """experiment=seed_blog_cpu's dp row: the reason is the missing GPU, not the empty list."""
    with pytest.raises(ConfigError) as info:
        place_as(run_config("single", gpus=[]), NO_GPU, "all")
    assert info.value.key == "strategy" and "needs CUDA GPUs and this machine has none" in str(info.value)
    assert "gpus=[0,1]" not in str(info.value)


def test_batch_not_divisible_by_the_workers_is_refused_with_a_helpful_message():
    with pytest.raises(ConfigError) as info:
        place_as(run_config("ddp", gpus=[0, 1, 3], batch_size=10), FOUR_GPUS, "per_device")
    error = info.value
    assert error.key == "batch_size" and error.value == 10
    message = str(error)
    assert "batch_size=10" in message and "multiple of the 3 workers" in message
    assert "9" in message and "12" in message and "strategy=ddp" in message


def test_batch_not_divisible_on_cpu_names_nprocs_workers():
    with pytest.raises(ConfigError) as info:
        place_as(run_config("ddp", nprocs=4, batch_size=6), NO_GPU, "per_device")
    assert info.value.key == "batch_size" and "4 workers" in str(info.value) and "8" in str(info.value)


def test_workers_without_a_batch_are_placed_whatever_their_count():
    """The collectives benchmark places 3 workers with no training batch to share: no batch check."""
    cpu = place_workers("collectives", (), 3, NO_GPU)
    assert cpu.devices == ("cpu:0", "cpu:1", "cpu:2") and cpu.local_batch == 1 and cpu.explicit_gpus
    gpu = place_workers("collectives", None, 2, FOUR_GPUS)
    assert gpu.devices == ("cuda:0", "cuda:1", "cuda:2", "cuda:3") and not gpu.explicit_gpus
    with pytest.raises(ConfigError) as info:  # given a batch, the training check applies
        place_workers("ddp", (), 4, NO_GPU, global_batch=6)
    assert info.value.key == "batch_size" and "4 workers" in str(info.value)


def test_cpu_placement_for_process_group_strategies():
    p = place_as(run_config("ddp", nprocs=2, batch_size=8), NO_GPU, "per_device")
    assert p.accelerator == "cpu" and p.gpus == () and p.torch_indices == ()
    assert p.devices == ("cpu:0", "cpu:1") and p.nprocs == 2 and p.local_batch == 4
    assert [p.rank_device(r) for r in range(2)] == ["cpu:0", "cpu:1"]
    assert p.threads_per_process == 1 and p.worker_env == {"OMP_NUM_THREADS": "1"}


def test_cpu_placement_for_a_one_process_strategy_ignores_nprocs():
    p = place_as(run_config("single", nprocs=2, batch_size=7), NO_GPU, "one")
    assert p.devices == ("cpu",) and p.nprocs == 1 and p.local_batch == 7
    assert p.threads_per_process == 2 and "CUDA_VISIBLE_DEVICES" not in p.worker_env


def test_empty_gpu_list_means_cpu_even_with_gpus_present():
    p = place_as(run_config("ddp", gpus=[], nprocs=2, batch_size=8), FOUR_GPUS, "per_device")
    assert p.accelerator == "cpu" and p.devices == ("cpu:0", "cpu:1")


def test_placement_survives_the_json_trip_to_the_workers():
    p = place_as(run_config("ddp", gpus=[0, 1, 3]), FOUR_GPUS, "per_device")
    back = Placement.from_dict(json.loads(json.dumps(p.as_dict())))
    assert back == p
    assert back.rank_device(2) == "cuda:3"


@pytest.mark.parametrize(("env", "count", "expected"), [
    ("2,3", 2, (2, 3)),
    ("2,3", 1, (2,)),
    (" 1 , 3 ", 2, (1, 3)),
    (None, 3, (0, 1, 2)),
    (None, 0, ()),
    ("", 4, ()),
])
def test_visible_gpus_numeric(env, count, expected):
    ids, tokens = visible_gpus(env, count)
    assert ids == expected and tokens == tuple(str(i) for i in expected)


UUIDS = "GPU-6d3f0f1c-aaaa,GPU-77aa-bbbb"
PHYSICAL = {"GPU-6d3f0f1c-aaaa": 5, "GPU-77aa-bbbb": 2}  # what nvmlDeviceGetIndex(ByUUID) would say


def test_uuids_resolve_to_physical_ids_and_keep_their_tokens():
    ids, tokens = visible_gpus(UUIDS, 2, physical_index=PHYSICAL.get)
    assert ids == (5, 2) and tokens == ("GPU-6d3f0f1c-aaaa", "GPU-77aa-bbbb")


def test_unresolvable_names_are_positions_and_keep_their_tokens():
    """MIG instances have no nvidia-smi index: positions in CUDA_VISIBLE_DEVICES, tokens kept."""
    ids, tokens = visible_gpus("MIG-11111111-aaaa,MIG-22222222-bbbb", 2, physical_index=lambda t: None)
    assert ids == (0, 1) and tokens == ("MIG-11111111-aaaa", "MIG-22222222-bbbb")


@pytest.mark.parametrize("resolver", [PHYSICAL.get, lambda t: None], ids=["uuid-resolved", "unresolved"])
def test_workers_get_the_gpus_chosen_by_uuid_not_indices(resolver):
    """Before: CUDA_VISIBLE_DEVICES=GPU-a,GPU-b became the workers' `0,1`: the machine's first two GPUs."""
    ids, tokens = visible_gpus(UUIDS, 2, physical_index=resolver)
    hw = Hardware(visible_gpus=ids, cores=8, tokens=tokens)
    p = place_as(run_config("ddp", batch_size=8), hw, "per_device")
    assert p.worker_env["CUDA_VISIBLE_DEVICES"] == UUIDS.replace(" ", "")
    assert p.gpu_tokens == ("GPU-6d3f0f1c-aaaa", "GPU-77aa-bbbb")
    one = place_as(run_config("ddp", gpus=[ids[1]], batch_size=8), hw, "per_device")
    assert one.worker_env["CUDA_VISIBLE_DEVICES"] == "GPU-77aa-bbbb" and one.devices == (f"cuda:{ids[1]}",)


def test_probe_hardware_on_this_machine():
    hw = probe_hardware()
    assert hw.cores == usable_cores() >= 1
    if not torch.cuda.is_available():
        assert hw.visible_gpus == () and not hw.has_gpu


def test_a_tensor_parallel_group_reads_one_share_of_the_batch_so_the_batch_divides_by_the_groups_not_the_ranks():
    """4 ranks in 2 tensor-parallel groups of 2: a batch of 6 splits into 2 shares of 3 (6 is no multiple of the
    4 ranks); ranks 0, 1 read share 0 and ranks 2, 3 share 1. tp=0 is every rank: one share, the whole batch."""
    cfg = run_config("fsdp", gpus=[0, 1, 2, 3], batch_size=6)
    p = place(cfg, FOUR_GPUS, one_process_per_device=True, drives_all_devices=False, needs_cuda=False,
              tensor_parallel=2)
    assert (p.data_shards, p.local_batch) == (2, 3)
    assert [p.data_shard(r) for r in range(4)] == [0, 0, 1, 1]
    whole = place(cfg, FOUR_GPUS, one_process_per_device=True, drives_all_devices=False, needs_cuda=False,
                  tensor_parallel=0)
    assert (whole.data_shards, whole.local_batch, whole.data_shard(3)) == (1, 6, 0)
    with pytest.raises(ConfigError, match="batch_size=6 .*a multiple of the 4 workers"):
        place(cfg, FOUR_GPUS, one_process_per_device=True, drives_all_devices=False, needs_cuda=False)
    with pytest.raises(ConfigError, match="a multiple of the 2 data-parallel groups of 2 tensor-parallel ranks .* 6 or 8"):
        place(run_config("fsdp", gpus=[0, 1, 2, 3], batch_size=7), FOUR_GPUS, one_process_per_device=True,
              drives_all_devices=False, needs_cuda=False, tensor_parallel=2)
