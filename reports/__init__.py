"""Plots and the HTML report, read from results folders only (never the engine).

``load_run``/``load_many`` read folders, ``plot_runs`` writes PNG/SVG plots and
``write_report`` writes one self-contained HTML file comparing runs. The names are
imported on first use: ``import reports.plan`` (the plan figure) then costs matplotlib
only, not pandas and the report's modules.
"""

from __future__ import annotations

import importlib

_HOMES = {"write_report": "reports.html", "plot_runs": "reports.plots",
          **{n: "reports.load" for n in ("Results", "Run", "Sweep", "load_many", "load_run",
                                          "load_sweep")}}

__all__ = ["Results", "Run", "Sweep", "load_many", "load_run", "load_sweep", "plot_runs",
           "write_report"]


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'reports' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
