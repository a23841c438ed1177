"""Code and docs cite what a reader outside can follow: upstream issues and PRs, files here --
never this project's own tracker ("Issue #14", "issue 39", "tracker no. 7").  Every tracked text file
is searched; a number next to an upstream project's name or inside an upstream URL is a
citation and allowed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# "issue 14", "Issue #14", "issues #3 and #4", "tracker #9", "ticket 12" (any case)
OURS = re.compile(r"\b(?:issues?|tracker|ticket)\s*(?:no\.?\s*)?#?\s*\d+", re.I)
UPSTREAM = re.compile(r"(sglang|vllm|lightllm|tokenspeed|pymllm|mllm|hypothesis|pytorch|torch|"
                      r"crosshair|pytest|github\.com|PR|pull|CPython|python)(?:'s)?\W{0,3}$", re.I)
SKIP_SUFFIXES = (".json", ".patch", ".png", ".svg", ".whl")


def tracked_texts():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    for name in files:
        path = ROOT / name
        if name.endswith(SKIP_SUFFIXES) or not path.is_file():
            continue
        try:
            yield name, path.read_text()
        except UnicodeDecodeError:
            continue


def ours(text: str) -> list[str]:
    """The tracker references in ``text`` (a number an upstream name or URL precedes is not)."""
    out = []
    for m in OURS.finditer(text):
        before = text[max(0, m.start() - 30):m.start()]
        if "/issues/" in text[max(0, m.start() - 80):m.end()] or UPSTREAM.search(before):
            continue
        out.append(m.group(0))
    return out


def test_no_file_cites_our_tracker():
    hits = [(name, ref) for name, text in tracked_texts()
            if name != "tests/test_no_tracker_numbers.py" for ref in ours(text)]
    assert hits == []


def test_the_search_sees_every_form_and_spares_upstream_citations():
    for text in ("Issue #14.", "see issue 39", "ISSUES #3", "tracker no. 7", "ticket 2"):
        assert ours(text), text
    for text in ("SGLang #22862", "TokenSpeed #460", "PR #30986", "sgl-project/sglang#123",
                 "https://github.com/vllm-project/vllm/issues/17", "vLLM's issue #5",
                 "color: #333"):
        assert not ours(text), text
