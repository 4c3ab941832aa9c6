"""harness.collectives.writers: the table (median, bandwidths), the csv and the plot from made-up timings."""

from __future__ import annotations

import pytest

from harness.collectives.arithmetic import table_rows
from harness.collectives.writers import to_markdown, write_csv, write_plot

MiB = 2**20


# ---- the table and the plot, from made-up timings ----

FAKE = [{"op": "all_reduce", "size_bytes": 4096, "count": 1024, "seconds": [1e-4, 2e-4, 3e-4]},
        {"op": "all_reduce", "size_bytes": MiB, "count": MiB // 4, "seconds": [1e-3, 1e-3, 5e-3]},
        {"op": "all_gather", "size_bytes": MiB, "count": MiB // 4, "seconds": [2e-3]}]
HEADER = {"backend": "gloo", "world_size": 2, "devices": ["cpu:0", "cpu:1"], "dtype": "float32", "warmup": 1,
          "repeats": 3}


def test_table_uses_the_median(tmp_path):
    rows = table_rows(FAKE, 2)
    assert rows[0]["time_us"] == pytest.approx(200.0)  # median of 100, 200, 300 µs
    assert rows[1]["algbw_gbs"] == pytest.approx(MiB / 1e-3 / 1e9)  # 1.048576 GB/s
    assert rows[1]["busbw_gbs"] == pytest.approx(1.048576)  # x 2(2-1)/2 = 1
    assert rows[2]["busbw_gbs"] == pytest.approx(MiB / 2e-3 / 1e9 / 2)  # x (2-1)/2
    markdown = to_markdown(rows, HEADER, {"reduce_scatter": "at 4 KiB: RuntimeError: not supported"})
    assert "| all_reduce | 1 MiB | 1048576 | 1000.0 |" in markdown
    assert "| reduce_scatter | — |" in markdown and "not measured at 4 KiB: RuntimeError" in markdown
    write_csv(rows, tmp_path / "t.csv")
    lines = (tmp_path / "t.csv").read_text().splitlines()
    assert lines[0].startswith("op,size,size_bytes") and len(lines) == 4
    png = write_plot(rows, HEADER, tmp_path / "bandwidth.png")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
