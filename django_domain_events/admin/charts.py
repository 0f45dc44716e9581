"""The dashboard's charts as data the templates draw as inline SVG: a column chart of
stacked segments and a chart of one bar per row, every segment with its link."""

from __future__ import annotations

from typing import Any

#: A segment's colour by the kind of rows it counts.
CHART_COLOURS = {
    "succeeded": "#2e7d32",
    "failed": "#c05600",
    "dead": "#ba2121",
    "owed": "#1565c0",
    "scheduled": "#6a1b9a",
}

#: One segment of a column: (css class, count, link, hover text).
Segment = tuple[str, int, str | None, str]
#: One column: its label, and its segments from the bottom up.
Column = tuple[str, list[Segment]]


def _segment(
    css: str, count: int, url: str | None, title: str, x: float, y: float, w: float, h: float
) -> dict[str, Any]:
    return {
        "css": css,
        "count": count,
        "url": url,
        "title": title,
        "x": f"{x:.1f}",
        "y": f"{y:.1f}",
        "width": f"{w:.1f}",
        "height": f"{h:.1f}",
        "colour": CHART_COLOURS[css],
    }


def columns(
    name: str,
    title: str,
    bars: list[Column],
    ticks: dict[int, str],
    *,
    width: int = 720,
    height: int = 170,
) -> dict[str, Any]:
    """A column chart: one column per bar, each a stack of (css, count, url, title)
    segments, drawn bottom up; ``ticks`` labels some columns under the axis."""
    top, bottom = 14, 22
    plot = height - top - bottom
    peak = max([sum(seg[1] for seg in stack) for _, stack in bars] + [1])
    slot = width / len(bars)
    gap = min(2.0, slot * 0.2)
    columns = []
    for index, (label, stack) in enumerate(bars):
        x = index * slot + gap / 2
        base: float = top + plot
        segments = []
        for css, count, url, seg_title in stack:
            if not count:
                continue
            h = max(plot * count / peak, 1.5)
            base -= h
            segments.append(_segment(css, count, url, seg_title, x, base, slot - gap, h))
        total = sum(seg[1] for seg in stack)
        columns.append(
            {
                "label": label,
                "total": total,
                "segments": segments,
                "tick": ticks.get(index),
                "tick_x": f"{x + (slot - gap) / 2:.1f}",
            }
        )
    return {
        "name": name,
        "title": title,
        "width": width,
        "height": height,
        "axis_y": top + plot,
        "tick_y": height - 6,
        "peak": peak,
        "columns": columns,
        "horizontal": False,
    }


def rows_chart(
    name: str, title: str, rows: list[tuple[str, int, str | None]], css: str, width: int = 720
) -> dict[str, Any]:
    """A bar per row, label on the left, for categories with long names."""
    row_height, label_width = 22, 300
    peak = max([n for _, n, _ in rows] + [1])
    span = width - label_width - 60
    bars = []
    for index, (label, count, url) in enumerate(rows):
        y = index * row_height + 3
        w = max(span * count / peak, 1.5)
        bars.append(
            {
                "label": label,
                "total": count,
                "label_y": f"{y + 13:.1f}",
                "count_x": f"{label_width + w + 6:.1f}",
                "segments": [_segment(css, count, url, f"{label}: {count}", label_width, y, w, 16)],
            }
        )
    return {
        "name": name,
        "title": title,
        "width": width,
        "height": max(len(rows), 1) * row_height + 6,
        "label_x": label_width - 8,
        "columns": bars,
        "horizontal": True,
    }
