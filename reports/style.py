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


def lay_out_as_saved(fig, fmt: str = "png") -> None:
    """Leave ``fig`` as saving it as ``fmt`` would, without writing or rendering it.

    Each save runs the figure's layout again from where the last one left the axes,
    and an SVG's element ids hash those positions to the last bit, so the SVG saved
    after the PNG differs from one saved first. A process that saves only the SVG runs
    the PNG's layout pass first (same canvas, dpi and style, drawing disabled) and
    writes the bytes the one after the PNG writes."""
    if fmt != "png":
        raise ValueError(f"format {fmt!r}; expected 'png' (the format saved first)")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    with matplotlib.rc_context(STYLE):
        canvas, dpi = fig.canvas, fig.dpi
        FigureCanvasAgg(fig)  # what savefig switches to for a PNG
        try:
            fig.dpi = matplotlib.rcParams["savefig.dpi"]
            fig.draw_without_rendering()
        finally:
            fig.dpi = dpi
            fig.set_canvas(canvas)
