"""The report's images: one histogram plot per tensor with every method's range, drawn with matplotlib,
in worker processes when there are many."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from .tensors import COLOURS, FIG_DPI, FIG_SIZE, LABELS, REPORT_METHODS, TensorRow

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.lines import Line2D
    from matplotlib.text import Text

logger = logging.getLogger(__name__)

_PARALLEL_MIN = 48  # tensors to plot before worker processes pay off


# ---------------------------------------------------------------------------------------------
# Images


def plot_job(t: TensorRow, methods: Sequence[str]) -> dict[str, Any]:
    """What a worker needs to draw one tensor (plain, picklable data)."""
    return {
        "title": t.name,
        "dtype": t.dtype,
        "finite": t.finite,
        "counts": t.counts,
        "edges": t.edges,
        "ranges": [(m, t.ranges[m]) for m in methods if m in t.ranges],
        "auto_choice": t.auto_choice,
    }


def fmt_num(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "∞" if x > 0 else "-∞"
    return f"{x:.5g}"


_ArtistT = TypeVar("_ArtistT", bound="Artist")


def _add(axes: Axes, artist: _ArtistT) -> _ArtistT:
    """``axes.add_artist(artist)``, typed as the artist given (matplotlib's stub says a plain Artist)."""
    axes.add_artist(artist)
    return artist


class _Canvas:
    """One figure whose axes and artists are made once and updated for every tensor (creating
    axes, ticks and artists is what costs time in matplotlib; updating them is cheap)."""

    def __init__(self) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
        from matplotlib.patches import StepPatch
        from matplotlib.ticker import LogLocator, NullLocator

        self.fig = Figure(figsize=FIG_SIZE, dpi=FIG_DPI)
        FigureCanvasAgg(self.fig)
        self.rows = len(REPORT_METHODS)
        grid = self.fig.add_gridspec(
            2, 1, height_ratios=[3.0, 0.45 + 0.22 * self.rows], hspace=0.06, left=0.19, right=0.98, top=0.9, bottom=0.12
        )
        self.ax = ax = self.fig.add_subplot(grid[0])
        self.bar = bar = self.fig.add_subplot(grid[1], sharex=ax)
        self.title = self.fig.text(0.01, 0.975, "", fontsize=8, ha="left", va="top")
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, numticks=6))
        ax.yaxis.set_minor_locator(NullLocator())
        # (a figure text, not an axis label: placing axis labels measures every tick label)
        self.fig.text(0.095, 0.6, "count (log)", fontsize=7, rotation=90, ha="center", va="center")
        ax.tick_params(labelsize=7, labelbottom=False)
        ax.grid(axis="y", color="#e5e5e5", linewidth=0.5)
        bar.tick_params(axis="x", labelsize=7)
        bar.tick_params(axis="y", length=0, labelsize=6.5)
        bar.grid(axis="x", color="#eeeeee", linewidth=0.5)
        bar.yaxis.set_minor_locator(NullLocator())
        for spine in ("top", "right"):
            bar.spines[spine].set_visible(False)
            ax.spines[spine].set_visible(False)
        # add_artist: no autoscaling (the limits are set per tensor)
        self.fill = _add(ax, StepPatch([1], [0, 1], baseline=0.7, fill=True, facecolor="#9ecae1", linewidth=0))
        self.step = _add(ax, StepPatch([1], [0, 1], baseline=0.7, fill=False, edgecolor="#3182bd", linewidth=0.6))
        self.empty = ax.text(0.5, 0.5, "no finite values", transform=ax.transAxes, ha="center", va="center", fontsize=9)
        xaxis = ax.get_xaxis_transform()
        self.vlines: list[Line2D] = []
        self.bars: list[Line2D] = []
        self.ends: list[list[Line2D]] = []
        self.notes: list[Text] = []
        for _ in range(self.rows):
            self.vlines.append(_add(ax, Line2D([], [], transform=xaxis, alpha=0.85)))
            self.bars.append(_add(bar, Line2D([], [], linewidth=4.5, solid_capstyle="butt")))
            self.ends.append(
                [_add(bar, Line2D([], [], linestyle="none", markersize=7, markeredgewidth=1.2)) for _ in range(2)]
            )
            self.notes.append(
                bar.text(0.5, 0, "", transform=bar.get_yaxis_transform(), ha="center", va="center", fontsize=6.5)
            )

    def draw(self, job: dict[str, Any], path: str) -> None:
        ax, bar = self.ax, self.bar
        self.title.set_text(_plain_text(job["title"], 90) + f"   ({job['dtype']}, {job['finite']:,} finite values)")
        ranges = job["ranges"]
        counts, edges = job["counts"], job["edges"]
        finite_ranges = [r for _, r in ranges if math.isfinite(r[0]) and math.isfinite(r[1])]
        if counts.size:
            self.fill.set_data(counts, edges, baseline=0.7)
            self.step.set_data(counts, edges, baseline=0.7)
            ax.set_ylim(0.7, float(counts.max()) * 2.0)
            data_lo, data_hi = float(edges[0]), float(edges[-1])
        else:
            ax.set_ylim(0.7, 10.0)
            points = [v for r in finite_ranges for v in r] or [0.0]
            data_lo, data_hi = min(points), max(points)
        for patch in (self.fill, self.step):
            patch.set_visible(bool(counts.size))
        self.empty.set_visible(not counts.size)
        # the view: the data, widened for the ranges by at most a quarter of the data's width on
        # each side (a range reaching further is cut, its end drawn as an arrow)
        reach = (data_hi - data_lo) * 0.25 or max(abs(data_lo), abs(data_hi), 1e-6) * 0.25
        view_lo = max(min([data_lo] + [r[0] for r in finite_ranges]), data_lo - reach)
        view_hi = min(max([data_hi] + [r[1] for r in finite_ranges]), data_hi + reach)
        pad = (view_hi - view_lo) * 0.03 or max(abs(view_lo) * 0.05, 1e-6)
        ax.set_xlim(view_lo - pad, view_hi + pad)
        labels = []
        for row in range(self.rows):
            vline, line, (left, right), note = self.vlines[row], self.bars[row], self.ends[row], self.notes[row]
            if row >= len(ranges):
                for artist in (vline, line, left, right, note):
                    artist.set_visible(False)
                continue
            method, (low, high) = ranges[row]
            colour = COLOURS[method]
            y = self.rows - 1 - row
            finite = math.isfinite(low) and math.isfinite(high)
            for range_line in (vline, line, left, right):
                range_line.set_visible(finite)
                range_line.set_color(colour)
            note.set_visible(not finite)
            if finite:
                lo, hi = max(low, view_lo - pad), min(high, view_hi + pad)
                vline.set_data([low, low, math.nan, high, high], [0, 1, math.nan, 0, 1])
                vline.set_linestyle("--" if method == "auto" else "-")
                vline.set_linewidth(1.6 if method == "auto" else 1.0)
                line.set_data([lo, hi], [y, y])
                left.set_data([lo], [y])
                left.set_marker("<" if lo > low else "|")  # an arrow: the range goes on out of view
                right.set_data([hi], [y])
                right.set_marker(">" if hi < high else "|")
            else:
                note.set_text(f"{fmt_num(low)} \u2026 {fmt_num(high)}: not finite, not drawn")
                note.set_color(colour)
                note.set_y(y)
            label = LABELS.get(method, method)
            if method == "auto" and job["auto_choice"]:
                label = f"auto \u2192 {job['auto_choice']}"
            labels.append((y, label, colour))
        bar.set_ylim(self.rows - len(ranges) - 0.7, self.rows - 0.3)
        bar.set_yticks([y for y, _, _ in labels], [lab for _, lab, _ in labels])
        for tick, (_, _, colour) in zip(bar.get_yticklabels(), labels):
            tick.set_color(colour)
        self.fig.savefig(path, dpi=FIG_DPI, format="png")


_missing_glyphs: dict[str, bool] = {}


def _plain_text(text: str, limit: int) -> str:
    """``text`` shortened, with characters the plot font lacks written as ``\\uXXXX`` (matplotlib
    would draw boxes and warn)."""
    from matplotlib import font_manager

    if len(text) > limit:
        text = text[: limit - 3] + "..."
    font = None
    out = []
    for c in text:
        if c.isascii():
            out.append(c)
            continue
        if c not in _missing_glyphs:
            font = font or font_manager.get_font(font_manager.findfont(font_manager.FontProperties()))
            _missing_glyphs[c] = font.get_char_index(ord(c)) == 0
        out.append(f"\\u{ord(c):04x}" if _missing_glyphs[c] else c)
    return "".join(out)


def _render(jobs: list[tuple[dict[str, Any], str]]) -> None:
    """Draw and save each (job, png path) with one reused figure."""
    canvas = _Canvas()
    for job, path in jobs:
        canvas.draw(job, path)


def render_all(jobs: list[tuple[dict[str, Any], str]], workers: int) -> None:
    """Render the images, split over ``workers`` processes for large reports: this process takes
    one share, each other share goes (as JSON on stdin) to a fresh ``python -c`` worker
    (not multiprocessing, whose spawn would re-run the caller's ``__main__``, nor fork, unsafe in
    a process running Rust and onnxruntime threads)."""
    if workers <= 1 or len(jobs) < _PARALLEL_MIN:
        _render(jobs)
        return
    chunks = [jobs[i::workers] for i in range(workers)]
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    code = "import sys; from histocal.report.images import _worker_main; _worker_main(sys.stdin)"
    procs: list[subprocess.Popen[str]] = []
    try:
        for chunk in chunks[1:]:
            proc = subprocess.Popen(
                [sys.executable, "-c", code],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=env,
                text=True,
                encoding="utf-8",
            )
            procs.append(proc)
            payload = [
                ({**job, "counts": job["counts"].tolist(), "edges": job["edges"].tolist()}, path) for job, path in chunk
            ]
            threading.Thread(target=_feed, args=(proc, json.dumps(payload)), daemon=True).start()
        _render(chunks[0])
        for proc in procs:
            if proc.stderr is None:  # not possible: started with stderr=PIPE
                raise RuntimeError("report image worker has no stderr pipe")
            stderr = proc.stderr.read()
            if proc.wait() != 0:
                last = (stderr.strip().splitlines() or ["no message"])[-1]
                raise RuntimeError(f"report image worker failed (exit {proc.returncode}): {last}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()


def _feed(proc: subprocess.Popen[str], text: str) -> None:
    if proc.stdin is None:  # not possible: started with stdin=PIPE
        raise RuntimeError("report image worker has no stdin pipe")
    with contextlib.suppress(OSError, ValueError):
        proc.stdin.write(text)
        proc.stdin.close()


def _worker_main(stream: Any) -> None:
    """Entry point of an image worker process: JSON ``[[job, path], ...]`` on ``stream``."""
    jobs = [
        (
            {
                **job,
                "counts": np.asarray(job["counts"], np.uint64),
                "edges": np.asarray(job["edges"], np.float64),
                "ranges": [(m, tuple(r)) for m, r in job["ranges"]],
            },
            path,
        )
        for job, path in json.load(stream)
    ]
    _render(jobs)
