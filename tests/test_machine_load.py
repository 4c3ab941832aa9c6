"""harness/launch/machine_load.py: the CPU time others took during a run's steady windows, by hand, and a real
busy process seen by the real readings."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from harness.launch.machine_load import BUSY_SHARE, MIN_JUDGED_S, LoadReadings, machine_section


def test_others_cpu_time_is_the_machines_busy_time_less_the_runs_inside_the_windows_by_hand():
    # readings every second: the machine's busy CPU seconds rise 1.2/s, the run's own 1.0/s (others 0.2/s);
    # between t=4 and t=6 another process adds 1.0/s more (others 1.5/s there)
    readings, machine, own = [], 0.0, 0.0
    for t in range(10):
        readings.append((100.0 + t, machine, own))
        machine += 1.2 + (1.0 if 4 <= t < 6 else 0.0)
        own += 1.0
    quiet = machine_section(readings, [(100.5, 102.5)], cores=2, load_before=0.3)
    assert quiet["others_cpu_s"] == pytest.approx(0.4) and quiet["windows_s"] == pytest.approx(2.0)
    assert quiet["busy"] is False and quiet["reason"] is None and quiet["load_before"] == 0.3
    assert 0.4 / 2.0 < BUSY_SHARE * 2  # 0.2 of 2 cores: quiet
    # windows 104-106 (others 1.2 cores for 2 s = 2.4 s) and 107-108 (0.2 s): 2.6 CPU-s over 3 s
    busy = machine_section(readings, [(104.0, 106.0), (107.0, 108.0)], cores=2, load_before=None)
    assert busy["others_cpu_s"] == pytest.approx(2.6) and busy["windows_s"] == pytest.approx(3.0)
    assert 2.6 / 3.0 >= BUSY_SHARE * 2 and busy["busy"] is True
    assert busy["reason"] == "other processes used 0.9 of 2 cores during its windows"
    # a window outside the readings: unknown, not 0, and not busy
    unknown = machine_section(readings, [(99.0, 101.0)], cores=2, load_before=None)
    assert unknown["others_cpu_s"] is None and unknown["busy"] is False
    # the same busy stretch seen through windows of 0.9 s in all (< MIN_JUDGED_S): counted, but too short to judge
    short = machine_section(readings, [(104.0, 104.9)], cores=2, load_before=None)
    assert short["others_cpu_s"] == pytest.approx(1.08) and short["windows_s"] == pytest.approx(0.9)
    assert 1.08 / 0.9 >= BUSY_SHARE * 2 and short["busy"] is False and MIN_JUDGED_S == 1.0


def test_another_pids_gpu_use_makes_the_run_busy_too():
    section = machine_section([(0.0, 0.0, 0.0), (10.0, 5.0, 5.0)], [(1.0, 9.0)], cores=2, load_before=None,
                              others_gpu_pct=40.0)
    assert section["others_cpu_s"] == pytest.approx(0.0) and section["busy"] is True
    assert section["reason"] == "another process used 40 % of a GPU's SMs"


@pytest.mark.slow
def test_the_readings_see_a_process_outside_the_run_burning_cpu_and_not_the_runs_own():
    """The run is this process and the processes below it: a child spinning is the run's own time; a process
    outside its tree spinning is others' time."""
    spin = "import time; t = time.time() + 1.5; [0 for _ in iter(lambda: time.time() < t, False)]"
    readings = LoadReadings(os.getpid(), 0.1).start()
    start = time.time()
    own = subprocess.Popen([sys.executable, "-c", spin])  # below this process: the run's
    own.wait()
    middle = time.time()
    # a grandchild whose parent shell exits at once: re-parented away, outside this process's tree
    shell = subprocess.run(["sh", "-c", f"{sys.executable} -c '{spin}' >/dev/null 2>&1 & echo $!"],
                           capture_output=True, text=True, check=True)
    outsider = int(shell.stdout.strip())
    assert outsider not in {p.pid for p in psutil.Process().children(recursive=True)}
    while psutil.pid_exists(outsider) and psutil.Process(outsider).status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.05)
    end = time.time()
    readings.stop()
    from harness.launch.activity import counter_at

    own_cpu = [(at, run) for at, _, run in readings.readings]

    def own_between(a: float, b: float) -> float:
        return counter_at(own_cpu, b) - counter_at(own_cpu, a)  # type: ignore[operator]

    # the child's spin is the run's own time (whatever else the machine does: the suite runs beside this test)
    first = (start + 0.2, middle - 0.2)
    assert own_between(*first) > 0.3 * (first[1] - first[0])  # a core, shared with whatever else runs
    # the outsider's spin is not the run's, and the machine's busy time minus the run's shows it as others'
    second = (middle + 0.4, end - 0.2)
    assert own_between(*second) < 0.15 * (second[1] - second[0])
    outside = machine_section(readings.readings, [second], cores=psutil.cpu_count() or 1, load_before=None)
    assert outside["others_cpu_s"] > 0.3 * (second[1] - second[0])
