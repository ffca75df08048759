"""Run directory -> one self-contained HTML report; figures built as data."""

from __future__ import annotations

from mpsearch.report._figures import (
    figure_curve,
    figure_distribution,
    figure_flops,
    figure_front,
    figure_op_types,
    figure_reverse,
    figure_sensitivity,
)
from mpsearch.report._llm import write_llm_report
from mpsearch.report._page import (
    CLASS_COLORS,
    MAX_BINS,
    axis,
    esc,
    format_color,
    layout,
    node_axis,
    rebin,
    render_page,
    rounded,
    size_unit,
)
from mpsearch.report._report import (
    MAX_DISTRIBUTION_NODES,
    RunFiles,
    load_run,
    render_report,
    write_report,
)

__all__ = [
    "CLASS_COLORS",
    "MAX_BINS",
    "MAX_DISTRIBUTION_NODES",
    "RunFiles",
    "axis",
    "esc",
    "figure_curve",
    "figure_distribution",
    "figure_flops",
    "figure_front",
    "figure_op_types",
    "figure_reverse",
    "figure_sensitivity",
    "format_color",
    "layout",
    "load_run",
    "node_axis",
    "rebin",
    "render_page",
    "render_report",
    "rounded",
    "size_unit",
    "write_llm_report",
    "write_report",
]
