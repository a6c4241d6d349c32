"""The sweep's console table, from a gathered table (no simulation needed)."""

import math

import pandas as pd

from sim.sweep import format_table


def test_one_row_per_point_with_the_varied_keys_seed_hit_rate_ttft_and_verdict():
    table = pd.DataFrame({
        "cache.host_policy": ["lru", "duplicate_first", "lru"],
        "host.ratio": [1.0, 1.0, 2.0],
        "workload.kind": ["zipf_documents"] * 3,
        "seed": [0, 0, 1],
        "point_id": ["a", "b", "c"],
        "hit_rate": [0.7012, 0.8133, math.nan],
        "ttft_p50_s": [0.0123, 0.0101, None],
        "ttft_p99_s": [0.5, 45.0, None],
        "verdict": ["agree", "agree", "detected"],
    })
    table.attrs["parameter_columns"] = ["cache.host_policy", "host.ratio", "workload.kind"]
    lines = format_table(table).splitlines()
    # workload.kind is the same everywhere: not shown
    assert lines[0].split() == ["cache.host_policy", "host.ratio", "seed", "hit", "rate",
                                "TTFT", "p50", "TTFT", "p99", "verdict"]
    assert set(lines[1]) == {"-"}
    assert lines[2].split() == ["lru", "1.0", "0", "70.1%", "12.3", "ms", "500", "ms", "agree"]
    assert lines[3].split() == ["duplicate_first", "1.0", "0", "81.3%", "10.1", "ms", "45", "s",
                                "agree"]
    assert lines[4].split() == ["lru", "2.0", "1", "-", "-", "-", "detected"]
