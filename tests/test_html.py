"""``kvcheck replay --html``: one self-contained page, each step drawn, the break highlighted."""

import re
import shutil
import struct
import subprocess
import zlib

import pytest

from state_machines.cli import main
from state_machines.html import render_html
from state_machines.ops import Op
from state_machines.trace import Trace

OPS = [Op("insert", {"tokens": [1, 2, 3]}), Op("insert", {"tokens": [1, 2, 4, 5]}),
       Op("admit", {"rid": 1, "tokens": [1, 2, 3, 0]}), Op("prefill", {"rid": 1, "n": 1})]


def test_page_draws_every_step_and_marks_the_break():
    page, result = render_html(Trace("radix", {"page_size": 1, "pool_pages": 16}, OPS, "R4"))
    assert result.failed_step == 3
    assert page.count('<section class="step') == 3  # two good steps + the broken one
    assert page.count("<svg") == 3
    broke = re.search(r'<section class="step broke" id="step-3">(.*?)</section>', page, re.S)
    assert broke and "ref-balance" in broke.group(1) and "lock ref is 0" in broke.group(1)
    assert 'class="node protected"' in page and 'class="node evictable"' in page
    assert "#2 [1 2]" in page  # the split node, drawn with its key
    assert "<script" not in page and "http://" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")  # self-contained


def test_page_for_a_passing_trace_says_so():
    page, result = render_html(Trace("radix", {"page_size": 1, "pool_pages": 16}, OPS))
    assert result.ok and "All properties hold at every step" in page
    assert page.count('<section class="step"') == 4 and 'class="step broke"' not in page


def test_cli_writes_the_page(tmp_path, capsys):
    path = Trace("radix", {"page_size": 1, "pool_pages": 16}, OPS, "R4").save(tmp_path)
    out = tmp_path / "r.html"
    assert main(["replay", str(path), "--html", str(out)]) == 1
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert main(["replay", str(path), "--html", str(tmp_path / "no" / "such" / "r.html")]) == 2


def _png_pixels(data: bytes) -> bytes:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    return zlib.decompress(idat)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian chromium not installed")
def test_headless_render_is_not_blank(tmp_path):
    page, _ = render_html(Trace("radix", {"page_size": 1, "pool_pages": 16}, OPS, "R4"))
    html = tmp_path / "r.html"
    html.write_text(page)
    png = tmp_path / "r.png"
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={png}",
                    "--window-size=900,1200", html.as_uri()],
                   capture_output=True, timeout=120, check=False)
    assert png.exists(), "chromium wrote no screenshot"
    raw = _png_pixels(png.read_bytes())
    # a blank page is one colour; the drawing has text, boxes in several colours and edges
    assert len(set(raw)) > 40


# measured in the browser after layout: every text's box must lie inside its node's rect
OVERFLOW_PROBE = """<script>
window.addEventListener("load", function () {
  var bad = [], n = 0;
  document.querySelectorAll("svg g.node").forEach(function (g) {
    var r = g.querySelector("rect"), rx = r.x.baseVal.value, rw = r.width.baseVal.value;
    g.querySelectorAll("text").forEach(function (t) {
      n++;
      var b = t.getBBox();
      if (b.x < rx || b.x + b.width > rx + rw) bad.push(t.textContent);
    });
  });
  var out = document.createElement("pre");
  out.id = "overflow-report";
  out.textContent = JSON.stringify({texts: n, overflowing: bad});
  document.body.appendChild(out);
});
</script>"""


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian chromium not installed")
@pytest.mark.parametrize("trace_file", ["tests/regressions/himamba-61f530691f.json",
                                        "tests/regressions/paged-bigpage-56e5102660.json"])
def test_headless_render_has_no_text_overflowing_its_box(tmp_path, trace_file):
    import json

    from state_machines.trace import load_trace

    page, _ = render_html(load_trace(trace_file))
    html = tmp_path / "r.html"
    html.write_text(page.replace("</body>", OVERFLOW_PROBE + "</body>"))  # a test copy only
    p = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                        "--disable-quic", "--no-first-run", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync",
                        f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", html.as_uri()],
                       capture_output=True, text=True, timeout=120, check=False)
    found = re.search(r'<pre id="overflow-report">(.*?)</pre>', p.stdout, re.S)
    assert found, "chromium did not run the probe"
    report = json.loads(found.group(1).replace("&gt;", ">").replace("&lt;", "<")
                        .replace("&amp;", "&"))
    assert report["texts"] > 10  # it measured the drawing
    assert report["overflowing"] == []
