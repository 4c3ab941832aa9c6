"""harness.collectives.worker: the rank side, in this process as a one-rank gloo group."""

from __future__ import annotations

from harness.collectives.arithmetic import OPS
from harness.collectives.config import CollectivesConfig, placement_for
from harness.collectives.worker import measure
from harness.launch.placement import Hardware

NO_GPU = Hardware(visible_gpus=(), cores=2)


def test_measure_in_process_records_what_cannot_run(monkeypatch):
    """A one-rank gloo group in this process: every op is timed, send/recv (needs a peer) is recorded
    as not measured instead of failing the benchmark."""
    import socket

    from strategies.base import BareProcessGroup, RankEnv

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    placement = placement_for({"gpus": [], "nprocs": 1}, NO_GPU)
    group = BareProcessGroup()
    group.setup(RankEnv(0, 0, 1, placement, timeout_s=30))
    try:
        cfg = CollectivesConfig.from_dict({"ops": list(OPS), "sizes": [4096], "warmup": 1, "repeats": 2})
        measured, unsupported = measure(cfg, group, rank=0, n=1)
        # after compute: each gap's calls beside the barrier's, by the gap in ms (sorted, as JSON keys)
        after = CollectivesConfig.from_dict({"ops": ["all_reduce"], "sizes": [4096], "repeats": 3,
                                             "after_compute_ms": [2, 0.5]})
        (row,), _ = measure(after, group, rank=0, n=1)
        at = CollectivesConfig.from_dict({"ops": ["all_reduce"], "sizes": ["4KiB", "8KiB"], "repeats": 1,
                                          "after_compute_ms": [0.5], "after_compute_at": "8KiB"})
        only_at, _ = measure(at, group, rank=0, n=1)
    finally:
        group.teardown()
    assert [m["op"] for m in measured] == [op for op in OPS if op != "sendrecv"]
    assert all(len(m["seconds"]) == 2 and m["size_bytes"] == 4096 and "after_compute" not in m for m in measured)
    assert list(row["after_compute"]) == ["0.5", "2"] and all(len(t) == 3 for t in row["after_compute"].values())
    # collectives.after_compute_at: that size alone also after compute
    assert [(m["size_bytes"], list(m.get("after_compute", {}))) for m in only_at] == [(4096, []), (8192, ["0.5"])]
    assert list(unsupported) == ["sendrecv"] and "at least 2 ranks" in unsupported["sendrecv"]


def test_the_spec_reaches_each_worker_as_records():
    """What the launcher pickles for every worker (as a training rank's RankSpec): the checked config and the
    placement as the records the runner made, read by attribute, not re-parsed from a dict."""
    import pickle

    from harness.collectives.worker import CollectivesSpec
    from harness.core.devices import Placement

    cfg = CollectivesConfig.from_dict({"ops": ["all_reduce"], "sizes": [4096], "warmup": 1, "repeats": 2})
    spec = CollectivesSpec(collectives=cfg, placement=placement_for({"gpus": [], "nprocs": 2}, NO_GPU),
                           record_dir="/tmp/ranks", timeout_s=30)
    received = pickle.loads(pickle.dumps(spec))
    assert received == spec and isinstance(received.placement, Placement) and received.collectives.sizes == (4096,)
    assert received.placement.world_size == 2 and received.log_file is None
