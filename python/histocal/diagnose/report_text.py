"""A diagnosis as plain text (``Diagnosis.summary`` and ``histocal diagnose``'s output)."""

from __future__ import annotations

import math
from typing import Any


def _db(x: float | None) -> str:
    if x is None:
        return "-"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:+.2f}" if abs(x) < 1e6 else f"{x:.3g}"


def _sqnr(x: float) -> str:
    return ("inf" if x > 0 else "-inf") if math.isinf(x) else f"{x:.2f}"


def summary_text(d: Any, max_rows: int = 20) -> str:
    """The diagnosis ``d``: SQNR before and after the suggestion, the candidate tensors, the
    sentinel and outlier findings, what the screen left unsplit, and the time spent."""
    lines = [
        f"output SQNR {_sqnr(d.sqnr_db)} dB ({d.method} ranges, {d.quantized_nodes} quantized nodes, "
        f"{d.quantized_tensors} quantized tensors, {d.eval_samples} held-back batches)",
    ]
    if d.quantized_nodes == 0:
        lines.append(
            "nothing quantizable: onnxruntime quantizes no node of this model (its operators, or every one excluded)"
        )
    elif d.nodes_to_exclude:
        lines.append(
            f"leaving {len(d.nodes_to_exclude)} nodes in float ({d.excluded_fraction:.1%} of the quantized nodes): "
            f"{_sqnr(d.sqnr_excluded_db)} dB ({_db(d.gain_db)} dB)"
        )
    else:
        lines.append("no exclusion within the limits gains anything measurable")
    if d.target_sqnr_db is not None:
        verdict = "reached" if d.target_reached else "not reached"
        lines.append(
            f"target {d.target_sqnr_db:g} dB {verdict} (at most {d.max_excluded_fraction:.0%} of the nodes in float)"
        )
    if d.nodes_to_exclude:
        lines.append("nodes_to_exclude: " + " ".join(d.nodes_to_exclude))
    if d.impacts:
        width = min(48, max(len(i.tensor) for i in d.impacts[:max_rows]))
        lines.append("")
        lines.append(f"{'tensor':<{width}}  {'alone dB':>9}  {'added dB':>9}  kept  nodes / note")
        for i in d.impacts[:max_rows]:
            tail = " ".join(i.nodes) if not i.note else i.note
            lines.append(
                f"{i.tensor[:width]:<{width}}  {_db(i.screen_gain_db):>9}  {_db(i.check_gain_db):>9}  "
                f"{'yes' if i.accepted else 'no':>4}  {tail}"
            )
    if d.findings:
        lines.append("")
        lines.append("ranges decided by a few values:")
        for f in d.findings[:max_rows]:
            lines.append(f"  {f.kind:<8} {f.tensor}: {f.detail}")
    if d.unresolved:
        lines.append("")
        lines.append("groups the screen left unsplit (the noise is spread over them):")
        for first, last, n, gain in d.unresolved:
            lines.append(f"  {n} tensors {first} .. {last}: {_db(gain)} dB")
    s = d.seconds
    lines.append("")
    lines.append(
        f"{d.screen_runs} screen runs on {d.screen_samples} batches, checks {d.checks}, quantizations {d.quantizations + 1}; "
        + ", ".join(f"{k} {v:.2f} s" for k, v in s.items())
    )
    return "\n".join(lines)
