"""A calibration report: one HTML page and one histogram image per tensor, from a histocal state.

``write_report(state, out_dir)`` (and ``histocal report STATE --out DIR``) writes:

* ``DIR/index.html``: a self-contained page (CSS only: no scripts, nothing fetched) with a summary
  table, one row per tensor, worst outliers first: dtype, finite count, NaN/+Inf/-Inf counts,
  min, max, the outlier ratio ``max|x| / p99.99(|x|)`` (highlighted above
  :data:`OUTLIER_THRESHOLD`), every method's range and its estimated quantization error as an
  SQNR in dB, and the candidate ``auto`` chose; then one section per plotted tensor;
* ``DIR/tensors/<file>.png``: the tensor's streaming histogram (trimmed to its occupied span,
  coarsened to at most :data:`DISPLAY_BINS` bins, log-scale counts) with every method's range as
  vertical lines, and below it one coloured bar per method (the legend) showing the range.

Methods: ``minmax``, ``entropy`` and ``percentile`` (onnxruntime's, computed by
``CalibrationState.compute``: the state's own settings for the method it was collected with,
onnxruntime's defaults otherwise), ``mse``, ``kl``, ``pow2`` (its default options), ``auto`` and
the table's other methods with a report colour whose summaries the state holds
(``CalibrationState.method_ranges``). ``qtype`` and ``symmetric`` apply to every method that takes
them and to the error estimate (``state.stream.qerrors``: the mean squared error of quantizing and
dequantizing the histogram's values with the range, under the installed onnxruntime's
scale/zero-point rule, see ``histocal.methods.scale_rule``). SQNR is
``10 log10(mean(x^2) / error)`` over the same histogram values.

Images need matplotlib (``pip install matplotlib``, or ``pip install '.[report]'`` in a histocal
checkout); it is used through its object API with the Agg canvas, so the caller's pyplot backend
is left alone. The directory is written atomically
as far as a directory can be: everything is rendered into a temporary sibling, then the
``tensors`` folder and ``index.html`` (last) are moved into place; an existing ``DIR`` keeps its
other files, and is written into only when its ``index.html`` (if any) is a previous report and its
``tensors`` folder (if any) holds nothing but PNG files.
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import logging
import math
import os
import shutil
import tempfile
import time
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import methods as _methods
from ..methods.table import TABLE
from ..state import CalibrationState
from .diagnosis import diagnosis_html
from .images import fmt_num, plot_job, render_all
from .tensors import (
    COLOURS,
    FIG_DPI,
    FIG_SIZE,
    LABELS,
    OUTLIER_PERCENTILE,
    OUTLIER_THRESHOLD,
    REPORT_METHODS,
    TensorRow,
    compute_ranges,
    summarise,
)

logger = logging.getLogger(__name__)

__all__ = ["OUTLIER_THRESHOLD", "REPORT_METHODS", "MissingDependency", "require_matplotlib", "write_report"]

# histocal is installed from its source tree, not from an index: name the package itself.
_INSTALL_HINT = "pip install matplotlib (or pip install '.[report]' in histocal's source folder)"
_GENERATOR = '<meta name="generator" content="histocal report">'


class MissingDependency(ImportError):
    """matplotlib is not installed."""


def require_matplotlib() -> None:
    """MissingDependency (an ImportError) with the install command, unless matplotlib imports."""
    try:
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
        from matplotlib.figure import Figure  # noqa: F401
    except ImportError as exc:
        raise MissingDependency(f"histocal report needs matplotlib ({exc}): {_INSTALL_HINT}") from None


# ---------------------------------------------------------------------------------------------
# File names


_RESERVED = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10))}


def safe_file_names(names: Sequence[str], max_len: int = 80) -> list[str]:
    """Distinct, portable file stems (ASCII letters, digits, ``._-``) for tensor names; distinct
    also on case-insensitive file systems. A name that had to change gets a short hash of itself.

    Args:
        names: the tensor names.
        max_len: the longest stem before its hash.

    Returns:
        One stem per name, in order.
    """
    used: set[str] = set()
    out = []
    for name in names:
        text = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii")
        stem = "".join(c if c.isalnum() or c in "-_" else "_" for c in text)
        stem = "_".join(filter(None, stem.split("_")))[:max_len].strip("_-") or "tensor"
        digest = hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()
        if stem != name or stem.lower() in _RESERVED:
            stem = f"{stem}-{digest[:8]}"
        candidate, n = stem, 2
        while candidate.lower() in used:
            candidate, n = f"{stem}-{n}", n + 1
        used.add(candidate.lower())
        out.append(candidate)
    return out


# ---------------------------------------------------------------------------------------------
# HTML

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;margin:28px 0 8px} h3{font-size:15px;margin:0 0 6px;word-break:break-all}
.meta{color:#555;margin:0 0 12px} .meta code{background:#f3f3f3;padding:0 3px;border-radius:3px}
.legend span{display:inline-block;margin:0 14px 4px 0} .legend i{display:inline-block;width:14px;height:10px;margin-right:5px;vertical-align:baseline}
.wrap{overflow-x:auto;border:1px solid #ddd;border-radius:4px}
table{border-collapse:collapse;font-size:12.5px;font-variant-numeric:tabular-nums}
th,td{padding:4px 8px;border-bottom:1px solid #eee;text-align:right;white-space:nowrap;vertical-align:top}
th{background:#f6f6f6;position:sticky;top:0;border-bottom:2px solid #ccc}
th.m{border-top:3px solid var(--c)}
td.name,th.name{text-align:left;white-space:normal;word-break:break-all;min-width:14em;max-width:28em}
tbody tr:nth-child(even){background:#fafafa} tbody tr:hover{background:#eef5fc}
td.r small{display:block;color:#666} td.best small{color:#0a6b2d;font-weight:600}
td.out{background:#fde2e1;color:#a1100a;font-weight:600}
td.na{color:#aaa} .nonfinite{color:#a1100a;font-weight:600}
section.t{margin:22px 0;padding-top:10px;border-top:1px solid #e3e3e3}
section.t img{max-width:100%;height:auto;border:1px solid #eee}
.small{font-size:12px;color:#666} a{color:#1558b0;text-decoration:none} a:hover{text-decoration:underline}
.problems{background:#fff6e0;border:1px solid #f0d48a;padding:8px 12px;border-radius:4px}
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _count(n: int) -> str:
    return f"{n:,}"


def _range_cell(t: TensorRow, method: str, best: float | None) -> str:
    pair = t.ranges.get(method)
    if pair is None:
        return '<td class="r na">—</td>'
    low, high = pair
    sqnr = t.sqnr(method)
    quality = "SQNR n/a" if sqnr is None else "SQNR ∞" if math.isinf(sqnr) else f"{sqnr:.1f} dB"
    best_cls = " best" if sqnr is not None and best is not None and sqnr >= best - 1e-9 else ""
    err = f' data-error="{t.errors[method]!r}"' if method in t.errors else ""
    return (
        f'<td class="r{best_cls}" data-method="{method}" data-low="{low!r}" data-high="{high!r}"{err}>'
        f"{fmt_num(low)} … {fmt_num(high)}<small>{quality}</small></td>"
    )


def _nonfinite(t: TensorRow) -> str:
    parts = [f"{_count(v)} {label}" for v, label in ((t.nan, "NaN"), (t.posinf, "+Inf"), (t.neginf, "-Inf")) if v]
    return f'<span class="nonfinite">{_e(", ".join(parts))}</span>' if parts else "0"


def _ratio(r: float) -> str:
    return f"{r:.2f}" if r < 100 else f"{r:.0f}"


def _ratio_cell(t: TensorRow) -> str:
    if math.isnan(t.ratio):
        return '<td class="na">—</td>'
    cls = ' class="out"' if t.ratio > OUTLIER_THRESHOLD else ""
    return f'<td{cls} data-ratio="{t.ratio!r}">{_ratio(t.ratio)}</td>'


def _html(
    tensors: list[TensorRow],
    methods: Sequence[str],
    problems: dict[str, str],
    info: dict[str, Any],
    diagnosis: Any = None,
) -> str:
    out = [
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
        _GENERATOR,
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        f"<title>histocal report: {_e(info['source'])}</title><style>{_CSS}</style></head><body>",
        "<h1>histocal calibration report</h1>",
    ]
    flagged = sum(1 for t in tensors if t.ratio > OUTLIER_THRESHOLD)
    plotted = sum(1 for t in tensors if t.file)
    out.append(
        f'<p class="meta">State <code>{_e(info["source"])}</code> · {len(tensors)} tensors · collected in '
        f"{_e(info['mode'])} mode with {_e(info['method'])} · quantization to <code>{_e(info['qtype'])}</code>, "
        f"{'symmetric' if info['symmetric'] else 'asymmetric'} · {flagged} tensor(s) with outliers · "
        f"{plotted} plotted · histocal {_e(info['version'])}</p>"
    )
    out.append(
        '<p class="legend">'
        + "".join(f'<span><i style="background:{COLOURS[m]}"></i>{_e(LABELS.get(m, m))}</span>' for m in methods)
        + "</p>"
    )
    out.append(
        '<p class="small">Each method cell: the range (low … high) and the estimated SQNR of quantizing the '
        "tensor's histogram with it, 10·log10(mean x² / mean squared error), in dB (higher is better; the best per "
        f"tensor in green). Outlier ratio: max|x| / p{OUTLIER_PERCENTILE:g}(|x|), highlighted above "
        f"{OUTLIER_THRESHOLD:g}. minmax, entropy and percentile are onnxruntime's methods, here with "
        f"symmetric={bool(info['symmetric'])} (their other settings: the state's own for the method it was collected "
        "with, onnxruntime's defaults otherwise); pow2 uses its default options. "
        "Counts are finite values; NaN and ±Inf are listed apart.</p>"
    )
    if problems:
        out.append(
            '<div class="problems"><b>Not available:</b><ul>'
            + "".join(f"<li><b>{_e(m)}</b>: {_e(p)}</li>" for m, p in problems.items())
            + "</ul></div>"
        )

    if diagnosis is not None:
        out.append(diagnosis_html(diagnosis, {t.name: t.file for t in tensors if t.file}))
    out.append(
        '<h2 id="summary">Tensors, by outlier ratio</h2><div class="wrap"><table><thead><tr>'
        '<th>#</th><th class="name">tensor</th><th>dtype</th><th>count</th><th>NaN / Inf</th>'
        "<th>min</th><th>max</th><th>outlier ratio</th>"
    )
    out += [f'<th class="m" style="--c:{COLOURS[m]}">{_e(LABELS.get(m, m))}</th>' for m in methods]
    if "auto" in methods:
        out.append("<th>auto's choice</th>")
    out.append("</tr></thead><tbody>")
    for i, t in enumerate(tensors, 1):
        name = f'<a href="#{_e(t.file)}">{_e(t.name)}</a>' if t.file else _e(t.name)
        sqnrs = [s for s in (t.sqnr(m) for m in methods) if s is not None]
        best = max(sqnrs) if sqnrs else None
        row = [
            f"<td>{i}</td>",
            f'<td class="name" data-name="{_e(t.name)}">{name}</td>',
            f"<td>{_e(t.dtype)}</td>",
            f"<td>{_count(t.finite)}</td>",
            f"<td>{_nonfinite(t)}</td>",
            f"<td>{fmt_num(t.min)}</td>",
            f"<td>{fmt_num(t.max)}</td>",
            _ratio_cell(t),
        ]
        row += [_range_cell(t, m, best) for m in methods]
        if "auto" in methods:
            row.append(f'<td data-auto="{_e(t.auto_choice or "")}">{_e(t.auto_choice or "—")}</td>')
        out.append("<tr>" + "".join(row) + "</tr>")
    out.append("</tbody></table></div>")

    if plotted:
        out.append("<h2>Histograms</h2>")
        if plotted < len(tensors):
            out.append(
                f'<p class="small">The {plotted} tensors with the largest outlier ratios (of {len(tensors)}).</p>'
            )
    for t in tensors:
        if not t.file:
            continue
        facts = [t.dtype, f"{_count(t.finite)} finite values", f"min {fmt_num(t.min)}", f"max {fmt_num(t.max)}"]
        if not math.isnan(t.ratio):
            facts.append(f"outlier ratio {_ratio(t.ratio)}")
        if t.auto_choice:
            facts.append(f"auto chose {t.auto_choice}")
        out.append(
            f'<section class="t" id="{_e(t.file)}"><h3>{_e(t.name)}</h3>'
            f'<p class="small">{_e(" · ".join(facts))} · <a href="#summary">back to the table</a></p>'
            f'<img src="tensors/{_e(t.file)}.png" alt="histogram of {_e(t.name)}" loading="lazy" '
            f'width="{int(FIG_SIZE[0] * FIG_DPI)}" height="{int(FIG_SIZE[1] * FIG_DPI)}"></section>'
        )
    out.append("</body></html>\n")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Writing the directory


def _check_replaceable(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise NotADirectoryError(f"{out_dir}: exists and is not a directory")
    images = out_dir / "tensors"
    if images.is_symlink() or (images.exists() and not images.is_dir()):
        raise ValueError(f"{images}: exists and is not a report's image folder; choose another --out")
    if images.is_dir():
        strays = [p.name for p in images.iterdir() if p.suffix != ".png" or not p.is_file() or p.is_symlink()]
        if strays:
            raise ValueError(
                f"{images}: holds files that are not report images ({strays[0]!r}, ...); "
                "choose another output directory"
            )
    index = out_dir / "index.html"
    if index.is_symlink() or (index.exists() and not index.is_file()):
        raise ValueError(f"{index}: exists and is not a file; choose another output directory")
    if index.is_file():
        with open(index, "rb") as f:
            head = f.read(4096)
        if _GENERATOR.encode() not in head:
            raise ValueError(f"{index}: exists and is not a histocal report; choose another output directory")


def _install(staging: Path, out_dir: Path) -> None:
    """Move the staged ``tensors`` folder and ``index.html`` into ``out_dir`` (index last)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    images, old = out_dir / "tensors", None
    if images.exists():
        old = Path(tempfile.mkdtemp(dir=out_dir, prefix=".tensors.old."))
        os.replace(images, old / "tensors")
    os.replace(staging / "tensors", images)
    os.replace(staging / "index.html", out_dir / "index.html")
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_report(
    state: Any,
    out_dir: str | os.PathLike[str],
    *,
    qtype: str = "int8",
    symmetric: bool = False,
    methods: Sequence[str] | None = None,
    max_tensors: int | None = None,
    workers: int | None = None,
    source: str | None = None,
    diagnosis: Any = None,
) -> Path:
    """Write the HTML report of a calibration state: each tensor's histogram and every method's range.

    Args:
        state: a ``CalibrationState`` or a state file.
        out_dir: the folder the page and its images go to.
        qtype: the quantized type the ranges are for.
        symmetric: symmetric ranges.
        methods: a subset of :data:`REPORT_METHODS` (default: all).
        max_tensors: plot only that many tensors, the largest outlier ratios first (the table
            lists every tensor).
        workers: processes drawing the images (default: the usable CPUs).
        source: how the page names the state (default: its file, or "in-memory state").
        diagnosis: a ``histocal.diagnose.Diagnosis``, shown in a section above the table.

    Returns:
        The path of ``index.html``.

    Raises:
        MissingDependency: matplotlib is not installed.
        ValueError: a bad option or an invalid state file.
    """
    require_matplotlib()
    if qtype not in _methods.QTYPES:
        raise ValueError(f"qtype must be one of {list(_methods.QTYPES)}, got {qtype!r}")
    default_methods = methods is None
    methods = list(REPORT_METHODS if methods is None else dict.fromkeys(methods))
    unknown = [m for m in methods if m not in REPORT_METHODS]
    if unknown or not methods:
        raise ValueError(f"report methods must be among {list(REPORT_METHODS)}, got {unknown or methods}")
    methods = [m for m in REPORT_METHODS if m in methods]
    if max_tensors is not None and (
        isinstance(max_tensors, bool) or int(max_tensors) != max_tensors or max_tensors < 0
    ):
        raise ValueError(f"max_tensors must be a non-negative integer, got {max_tensors!r}")
    if not isinstance(state, CalibrationState):
        source = str(state) if source is None else source
        state = CalibrationState.load(state)
    source = "in-memory state" if source is None else str(source)
    if state.stream is None:
        raise ValueError("the report needs the streaming histogram, and this state holds only exact histograms")
    if default_methods:  # a method reading summaries (with its default options) needs them collected
        methods = [m for m in methods if TABLE[m].summaries({}) <= set(state.stream.summaries)]
    out_dir = Path(out_dir)
    _check_replaceable(out_dir)

    start = time.perf_counter()
    tensors = [summarise(state.stream, n) for n in state.names]
    problems = {}
    for m in methods:
        problem = compute_ranges(state, tensors, m, qtype, bool(symmetric))
        if problem:
            problems[LABELS.get(m, m)] = problem
    order = sorted(range(len(tensors)), key=lambda i: (math.isnan(tensors[i].ratio), -np.nan_to_num(tensors[i].ratio)))
    tensors = [tensors[i] for i in order]
    plot = tensors if max_tensors is None else tensors[: int(max_tensors)]
    for t, stem in zip(plot, safe_file_names([t.name for t in plot])):
        t.file = stem
    computed = time.perf_counter()

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.tmp."))
    try:
        (staging / "tensors").mkdir()
        jobs = [(plot_job(t, methods), str(staging / "tensors" / f"{t.file}.png")) for t in plot]
        if workers is None:
            workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        render_all(jobs, max(1, int(workers)))
        info = {
            "source": source,
            "mode": state.mode,
            "method": state.method or "?",
            "qtype": qtype,
            "symmetric": bool(symmetric),
            "version": state.histocal_version,
        }
        (staging / "index.html").write_text(_html(tensors, methods, problems, info, diagnosis), encoding="utf-8")
        _install(staging, out_dir)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(staging)
    logger.info(
        "report: %d tensors (%d plotted): ranges %.2f s, images and page %.2f s",
        len(tensors),
        len(plot),
        computed - start,
        time.perf_counter() - computed,
    )
    return out_dir / "index.html"
