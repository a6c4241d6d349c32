"""The look and the savers every figure shares (``reports.plots``, the ``plan``
figures, the census), with only matplotlib imported: the plan figure is drawn in a
process that should not wait for pandas.

Output is deterministic: a fixed ``svg.hashsalt`` and no dates or software versions
in the metadata, so the same figure gives byte-identical SVG and PNG files.
"""

from __future__ import annotations

import matplotlib

FORMATS = ("png", "svg")

# rc settings every figure is built and saved under (rc_context: no global changes).
STYLE = {
    "svg.hashsalt": "hicache-sim",  # stable element ids -> byte-identical SVG
    "svg.fonttype": "path",
    "font.size": 9.5,
    "axes.titlesize": 10.5,
    "axes.titleweight": "bold",
    "axes.labelsize": 9.5,
    "figure.titlesize": 12,
    "figure.titleweight": "bold",
    "legend.fontsize": 8.5,
    "legend.frameon": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.6,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.linewidth": 1.6,
    "savefig.dpi": 120,
    "savefig.facecolor": "white",
    "path.simplify": True,
}
PNG_METADATA = {"Software": None}
SVG_METADATA = {"Date": None, "Creator": None}

# Stacked hit-rate bars: device hits, host hits (loaded back), misses (prefilled).
TIER_COLORS = {"device": "#3b75af", "host": "#ef8636", "storage": "#2a9d8f", "miss": "#d5d5d5"}


def save_figure(fig, target, fmt: str) -> None:
    """Save ``fig`` as ``fmt`` (png or svg) under ``STYLE``, deterministically."""
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r}; expected one of {FORMATS}")
    metadata = PNG_METADATA if fmt == "png" else SVG_METADATA
    with matplotlib.rc_context(STYLE):
        fig.savefig(target, format=fmt, metadata=metadata)
