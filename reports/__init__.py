"""Plots and the HTML report, read from results folders only (never the engine).

``load_run``/``load_many`` read folders, ``plot_runs`` writes PNG/SVG plots and
``write_report`` writes one self-contained HTML file comparing runs.
"""

from reports.html import write_report
from reports.load import Results, Run, Sweep, load_many, load_run, load_sweep
from reports.plots import plot_runs

__all__ = ["Results", "Run", "Sweep", "load_many", "load_run", "load_sweep", "plot_runs",
           "write_report"]
