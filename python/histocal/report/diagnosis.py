"""The report page's diagnosis section (``write_report(..., diagnosis=...)``).

The diagnosis is ``histocal.diagnose.Diagnosis`` (a layer above this one), read by its
attributes: the output SQNR before and after the suggested exclusions, the suggestion, the
candidate tensors with the screen's and the checks' gains, and the sentinel and outlier
findings (each linked to the tensor's row when the page lists it).
"""

from __future__ import annotations

import html
import math
from typing import Any


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _db(x: float | None, signed: bool = True) -> str:
    if x is None:
        return "—"
    if math.isinf(x):
        return "∞" if x > 0 else "−∞"
    return f"{x:+.2f}" if signed else f"{x:.2f}"


def diagnosis_html(d: Any, anchors: dict[str, str]) -> str:
    """The section for diagnosis ``d``; ``anchors``: tensor name -> id of its histogram section."""

    def tensor(name: str) -> str:
        return f'<a href="#{_e(anchors[name])}">{_e(name)}</a>' if name in anchors else _e(name)

    out = ['<h2 id="diagnosis">Diagnosis of the quantized model</h2>']
    facts = (
        f"Output SQNR against the float model on {d.eval_samples} held-back batches, {_e(d.method)} ranges: "
        f"<b>{_db(d.sqnr_db, False)} dB</b> ({d.quantized_nodes} quantized nodes, {d.quantized_tensors} "
        "quantized tensors)."
    )
    if d.nodes_to_exclude:
        facts += (
            f" Leaving the {len(d.nodes_to_exclude)} suggested nodes in float ({d.excluded_fraction:.1%} of the "
            f"quantized nodes): <b>{_db(d.sqnr_excluded_db, False)} dB</b> ({_db(d.gain_db)} dB, measured)."
        )
    else:
        facts += " No exclusion within the limits gains measurably."
    if d.target_sqnr_db is not None:
        facts += f" Target {d.target_sqnr_db:g} dB: {'reached' if d.target_reached else 'not reached'}."
    out.append(f'<p class="meta" data-sqnr="{d.sqnr_db!r}" data-sqnr-excluded="{d.sqnr_excluded_db!r}">{facts}</p>')
    if d.nodes_to_exclude:
        out.append(
            "<p>Suggested <code>nodes_to_exclude</code>: "
            + ", ".join(f'<code class="exclude">{_e(n)}</code>' for n in d.nodes_to_exclude)
            + "</p>"
        )
    if d.impacts:
        out.append(
            '<p class="small">Candidates, best first: the screen\'s estimate of the gain of leaving each tensor alone '
            "in float (quantization switched off per tensor on the screen batches), and the gain its nodes added "
            "when checked with the candidates kept before it (onnxruntime's rule: a tensor is in float when every "
            "quantized node next to it is excluded). The SQNR after exclusion above is onnxruntime's own.</p>"
        )
        out.append(
            '<div class="wrap"><table class="diagnosis"><thead><tr><th class="name">tensor</th><th>kind</th>'
            '<th>gain alone (screen)</th><th>gain added (check)</th><th>suggested</th><th class="name">nodes / note</th></tr>'
            "</thead><tbody>"
        )
        for i in d.impacts:
            note = _e(i.note) if i.note else _e(" ".join(i.nodes))
            out.append(
                f'<tr><td class="name" data-name="{_e(i.tensor)}">{tensor(i.tensor)}</td><td>{_e(i.kind)}</td>'
                f"<td>{_db(i.screen_gain_db)} dB</td><td>{_db(i.check_gain_db)} dB</td>"
                f'<td>{"yes" if i.accepted else "no"}</td><td class="name">{note}</td></tr>'
            )
        out.append("</tbody></table></div>")
    if d.findings:
        out.append('<h3>Ranges decided by a few values</h3><ul class="findings">')
        for f in d.findings:
            out.append(f'<li data-kind="{_e(f.kind)}"><b>{_e(f.kind)}</b> {tensor(f.tensor)}: {_e(f.detail)}</li>')
        out.append("</ul>")
    if d.unresolved:
        out.append('<p class="small">Groups the screen left unsplit (their noise is spread over many tensors): ')
        out.append("; ".join(f"{n} tensors {_e(a)} … {_e(b)} ({_db(g)} dB)" for a, b, n, g in d.unresolved) + ".</p>")
    cost = ", ".join(f"{_e(k)} {v:.2f} s" for k, v in d.seconds.items())
    out.append(
        f'<p class="small">{d.screen_runs} screen runs, {d.checks} checks, {d.quantizations + 1} quantizations; {cost}.</p>'
    )
    return "\n".join(out)
