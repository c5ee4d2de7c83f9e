"""The dashboards' panels drawn without Grafana: every query of every panel
evaluated over a time range by Prometheus's HTTP API (`query_range`) and
plotted with matplotlib, one PNG per dashboard, beside the raw answers
(`toolserve dashboards render`)."""

from __future__ import annotations

import json
import math
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from cluster.launch.dashboards import DASHBOARDS, PanelSpec

_LEGEND_LABEL = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def legend_text(template: str, labels: dict[str, str]) -> str:
    """Grafana's legend format: `{{label}}` becomes the series' value of it
    (empty when the series has none)."""
    return _LEGEND_LABEL.sub(lambda match: labels.get(match.group(1), ""), template).strip()


def query_range(
    prometheus_url: str, expr: str, start: datetime, end: datetime, step_s: float
) -> list[dict[str, Any]]:
    """A range query's result matrix (raises on a query Prometheus refuses)."""
    import httpx

    answer = httpx.get(
        f"{prometheus_url.rstrip('/')}/api/v1/query_range",
        params={
            "query": expr,
            "start": start.timestamp(),
            "end": end.timestamp(),
            "step": step_s,
        },
        timeout=60,
    )
    body = answer.json()
    if body.get("status") != "success":
        raise ValueError(f"{expr}: {body.get('error')}")
    return list(body["data"]["result"])


def _draw_panel(
    axes: Any, spec: PanelSpec, series: list[tuple[str, list[Any]]], start: datetime
) -> None:
    axes.set_title(spec.title, fontsize=9)
    axes.set_ylabel(spec.unit, fontsize=8)
    axes.tick_params(labelsize=7)
    drawn = 0
    for legend, values in series:
        points = [
            ((float(stamp) - start.timestamp()) / 60, float(value))
            for stamp, value in values
            if math.isfinite(float(value))
        ]
        if points:
            minutes, figures = zip(*points, strict=True)
            axes.plot(minutes, figures, label=legend or None, linewidth=1)
            drawn += 1
    if drawn == 0:
        axes.text(0.5, 0.5, "no data", ha="center", va="center", transform=axes.transAxes)
    elif any(legend for legend, _ in series):
        axes.legend(fontsize=6, loc="upper left")
    axes.set_xlabel("minutes", fontsize=8)


def render_dashboards(
    prometheus_url: str, start: datetime, end: datetime, directory: Path, step_s: float = 15
) -> list[Path]:
    """One PNG per dashboard (`<uid>.png`) and the range answers behind it
    (`<uid>.json`: each panel's queries and the series they returned)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for uid, (title, panels) in DASHBOARDS.items():
        columns = 2
        rows = math.ceil(len(panels) / columns)
        figure, grid = plt.subplots(rows, columns, figsize=(12, 3.2 * rows), squeeze=False)
        answers = []
        for index, spec in enumerate(panels):
            series: list[tuple[str, list[Any]]] = []
            for query in spec.queries:
                result = query_range(prometheus_url, query.expr, start, end, step_s)
                answers.append({"panel": spec.title, "expr": query.expr, "result": result})
                series += [
                    (legend_text(query.legend, item.get("metric", {})), item["values"])
                    for item in result
                ]
            _draw_panel(grid[index // columns][index % columns], spec, series, start)
        for index in range(len(panels), rows * columns):
            grid[index // columns][index % columns].axis("off")
        figure.suptitle(f"{title} ({start:%Y-%m-%d %H:%M} to {end:%H:%M} UTC)")
        figure.tight_layout()
        image = directory / f"{uid}.png"
        figure.savefig(image, dpi=80)
        plt.close(figure)
        (directory / f"{uid}.json").write_text(
            json.dumps(
                {
                    "prometheus": prometheus_url,
                    "start": start.isoformat(),
                    "end": end.isoformat(),
                    "step_s": step_s,
                    "queries": answers,
                },
                indent=1,
            )
            + "\n"
        )
        written.append(image)
    return written
