"""A replay as one self-contained HTML page: every step's op, result, counters and an SVG
drawing of the tree (locks/refs, evictable vs protected, host/device tier, tombstones and
snapshots marked), with the step where a property broke highlighted.

No network, no external JS or CSS: the page is a single file a person can open from a CI
artifact.  The drawing reads only the plain ``TreeView`` a subject exposes via ``tree_view()``
(NodeView.extra keys ``tier``, ``tombstone``, ``snapshot``, ``buffer`` are styled; any other
extra key is listed under the node); a subject without one shows its text outline.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from invariants.views import TreeView
from state_machines.replay import replay
from state_machines.trace import Trace

BOX_W, BOX_H, GAP_X, GAP_Y = 150, 58, 18, 34  # BOX_W: the narrowest box
CHAR_W, PAD_X = 7, 6  # 11px monospace advances ~6.6px a character; PAD_X: the left margin


@dataclass
class Frame:
    index: int
    words: str
    result: str
    counters: dict
    tree: TreeView | None
    outline: str
    broke: str | None = None


def _frames(trace: Trace, device=None) -> tuple[list[Frame], object]:
    frames: list[Frame] = []

    def grab(rec, run):
        frames.append(_frame(rec.index, rec.words, rec.result, run.subject))

    result = replay(trace, device=device, on_step=grab)
    if result.violation is not None:
        v = result.violation
        frames.append(_frame(result.failed_step, result.failed_op, "BROKE", result.run.subject,
                             broke=f"{v.prop}: {v.message}"))
    return frames, result


def _frame(index, words, result, subject, broke=None) -> Frame:
    try:
        tree = subject.tree_view()
    except Exception:  # a half-applied op can leave a tree a view cannot be built from
        tree = None
    try:
        outline = subject.outline()
    except Exception as exc:
        outline = f"(no outline: {type(exc).__name__}: {exc})"
    return Frame(index, words, result, dict(subject.counters()), tree, outline, broke)


# -- SVG ------------------------------------------------------------------------------------
def _layout(tree: TreeView) -> dict[int, tuple[float, int]]:
    """x slot and depth per node: leaves left to right, parents centred over children."""
    pos: dict[int, tuple[float, int]] = {}
    next_x = [0.0]

    def place(nid, depth, seen):
        if nid in seen or nid not in tree.nodes:
            return None
        seen.add(nid)
        node = tree.nodes[nid]
        kids = [place(c, depth + 1, seen) for _, c in sorted(node.children.items(),
                                                             key=lambda kv: str(kv[0]))]
        kids = [k for k in kids if k is not None]
        if kids:
            x = (kids[0] + kids[-1]) / 2
        else:
            x, next_x[0] = next_x[0], next_x[0] + 1
        pos[nid] = (x, depth)
        return x

    place(tree.root, 0, set())
    return pos


def _label_tokens(key) -> str:
    key = list(key)
    text = " ".join(map(str, key[:10])) + (" …" if len(key) > 10 else "")
    return f"[{text}]"


def _node_lines(tree: TreeView, nid) -> tuple[str, str, str]:
    """The three lines drawn in a node's box: title, refs, tags."""
    node = tree.nodes[nid]
    extra = dict(node.extra)
    title = "root" if nid == tree.root else f"#{nid} {_label_tokens(node.key)}"
    refs = " ".join(f"{k}={v}" for k, v in node.refs.items())
    tags = [f"{k}={v}" for k, v in extra.items() if k not in ("tier", "tombstone")]
    if extra.get("tier"):
        tags.insert(0, str(extra["tier"]))
    if extra.get("tombstone"):
        tags.insert(0, "tombstone")
    return title, refs, " ".join(tags)


def svg_tree(tree: TreeView) -> str:
    pos = _layout(tree)
    if not pos:
        return "<p>(empty view)</p>"
    # every box is as wide as the longest line any node draws (+ room for the snapshot dot):
    # no text is cut off or runs over its box
    box_w = max([BOX_W] + [len(line) * CHAR_W + 2 * PAD_X + 14 for nid in pos
                           for line in _node_lines(tree, nid)])
    width = (max(x for x, _ in pos.values()) + 1) * (box_w + GAP_X) + GAP_X
    height = (max(d for _, d in pos.values()) + 1) * (BOX_H + GAP_Y) + GAP_Y
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}"'
           f' viewBox="0 0 {width:.0f} {height:.0f}" role="img">']

    def xy(nid):
        x, d = pos[nid]
        return GAP_X + x * (box_w + GAP_X), GAP_Y / 2 + d * (BOX_H + GAP_Y)

    for nid in pos:
        node = tree.nodes[nid]
        if node.parent in pos:
            px, py = xy(node.parent)
            cx, cy = xy(nid)
            out.append(f'<line x1="{px + box_w / 2:.0f}" y1="{py + BOX_H:.0f}" '
                       f'x2="{cx + box_w / 2:.0f}" y2="{cy:.0f}" class="edge"/>')
    for nid in pos:
        node = tree.nodes[nid]
        x, y = xy(nid)
        extra = dict(node.extra)
        locked = any(v > 0 for v in node.refs.values())
        cls = ["node", "root" if nid == tree.root else ("protected" if locked else "evictable")]
        if extra.get("tier") == "host":
            cls.append("host")
        if extra.get("tombstone"):
            cls.append("tombstone")
        title, refs, tags = _node_lines(tree, nid)
        tip = html.escape(f"{title}  refs: {refs}  value: {list(node.value)}  {tags}")
        out.append(f'<g class="{" ".join(cls)}"><title>{tip}</title>'
                   f'<rect x="{x:.0f}" y="{y:.0f}" width="{box_w}" height="{BOX_H}" rx="6"/>'
                   f'<text x="{x + PAD_X:.0f}" y="{y + 16:.0f}">{html.escape(title)}</text>'
                   f'<text x="{x + PAD_X:.0f}" y="{y + 32:.0f}" class="refs">{html.escape(refs)}'
                   f'</text><text x="{x + PAD_X:.0f}" y="{y + 48:.0f}" class="tags">'
                   f'{html.escape(tags)}</text></g>')
        if extra.get("snapshot"):
            out.append(f'<circle cx="{x + box_w - 10:.0f}" cy="{y + 10:.0f}" r="6" '
                       f'class="snapshot"><title>snapshot</title></circle>')
    out.append("</svg>")
    return "".join(out)


CSS = """
body{font:14px system-ui,sans-serif;margin:24px;color:#222;background:#fafafa}
h1{font-size:20px} .meta{color:#555} .verdict{padding:8px 12px;border-radius:6px;margin:12px 0}
.ok{background:#e6f4ea;border:1px solid #34a853} .bad{background:#fce8e6;border:1px solid #d93025}
.step{background:#fff;border:1px solid #ddd;border-radius:8px;margin:14px 0;padding:10px 14px}
.step.broke{border:3px solid #d93025;background:#fff5f5}
.op{font-weight:600} .result{color:#555} .counters{font:12px monospace;color:#444}
.violation{color:#b00020;font-weight:600;margin:6px 0}
pre{background:#f4f4f4;padding:8px;overflow:auto;font-size:12px}
svg .edge{stroke:#888;stroke-width:1.5}
svg rect{stroke:#555;stroke-width:1.2;fill:#fff}
svg .evictable rect{fill:#d9f2dd} svg .protected rect{fill:#ffe2b8;stroke:#c26a00}
svg .root rect{fill:#e0e0e0} svg .host rect{stroke-dasharray:5 3;fill:#dde8ff}
svg .tombstone rect{fill:#cfcfcf;stroke:#777} svg text{font:11px monospace;fill:#222}
svg .refs{fill:#7a3e00} svg .tags{fill:#1a4d8f} svg .snapshot{fill:#8e24aa}
.legend span{display:inline-block;padding:2px 8px;margin-right:6px;border:1px solid #888;border-radius:4px}
"""


def render_html(trace: Trace, source: str = "", device=None) -> tuple[str, object]:
    """The page for ``trace``, and the replay result (so callers can set an exit code)."""
    frames, result = _frames(trace, device)
    esc = html.escape
    head = (f"{trace.variant} "
            + " ".join(f"{k}={v}" for k, v in trace.params.items())
            + (f", fault {trace.fault}" if trace.fault else "")
            + (f", target {trace.target}" if trace.target != "reference" else ""))
    if result.violation is None:
        verdict = ('<div class="verdict ok">All properties hold at every step'
                   + (f" (the trace recorded <b>{esc(trace.violation['property'])}</b> at step "
                      f"{trace.violation.get('step')}; it no longer fails)"
                      if trace.violation else "") + "</div>")
    else:
        v = result.violation
        verdict = (f'<div class="verdict bad">Property <b>{esc(v.prop)}</b> broke at step '
                   f'<a href="#step-{result.failed_step}">{result.failed_step}</a>: '
                   f"{esc(v.message)}</div>")
    parts = ["<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
             f"<title>kvcheck replay: {esc(head)}</title><style>{CSS}</style></head><body>",
             f"<h1>kvcheck replay</h1><div class=\"meta\">{esc(head)} &middot; "
             f"{len(trace.ops)} steps{(' &middot; ' + esc(source)) if source else ''}</div>",
             verdict,
             '<div class="legend"><span style="background:#d9f2dd">evictable</span>'
             '<span style="background:#ffe2b8">protected (locked)</span>'
             '<span style="background:#dde8ff;border-style:dashed">host tier</span>'
             '<span style="background:#cfcfcf">tombstone</span>'
             '<span style="color:#8e24aa">&#9679; snapshot</span></div>']
    for f in frames:
        cls = "step broke" if f.broke else "step"
        parts.append(f'<section class="{cls}" id="step-{f.index}">'
                     f'<div class="op">{f.index}. {esc(f.words)}</div>'
                     f'<div class="result">&rarr; {esc(f.result)}</div>')
        if f.broke:
            parts.append(f'<div class="violation">property broken: {esc(f.broke)}</div>')
        parts.append('<div class="counters">'
                     + esc(", ".join(f"{k}={v}" for k, v in f.counters.items())) + "</div>")
        parts.append(svg_tree(f.tree) if f.tree is not None else "")
        parts.append(f"<details><summary>outline</summary><pre>{esc(f.outline)}</pre>"
                     "</details></section>")
    parts.append("</body></html>")
    return "\n".join(parts), result
