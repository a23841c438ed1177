"""The gate's regression corpus (``ci/engine-gate/regression-corpus.sh``, docs/gating.md
"Regression corpus"): real upstream KV-cache fixes (SGLang, vLLM, LightLLM, pymllm) reverted
onto the pinned trees kvcheck drives.

Every revert patch must apply cleanly to its target's pinned tree (``# target:``, absent =
sglang) and say what it reverts (its ``# upstream:`` and ``# protects:`` header lines); a
patch whose tree is not in this Python (the SGLang wheel in ``.venv-upstream``, vLLM in
``.venv-vllm``; the LightLLM and pymllm snapshots anywhere they are found) is skipped here and
checked in the env that has it.  One SGLang revert, gated narrowed to fit CI (one variant, a
few dozen examples, a one-trace corpus), must fail the gate on the property its fix protects,
while the same narrowed gate passes the unmodified tree.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.upstream.snapshots import snapshot

REPO = Path(__file__).resolve().parents[2]
REVERTS = sorted((REPO / "ci/engine-gate/reverts").glob("*.patch"))
# the revert gated here: the one whose variant the narrowed gate runs fastest
GATED = ("sglang-22862-free-tail", "streaming-session", 60)

NO_SGLANG = ("sglang is not installed in this Python (bash ci/upstream/setup.sh builds "
             ".venv-upstream, where the upstream suite runs this)")
SNAPSHOTS = {"lightllm": "lightllm-87881ae7ca", "pymllm": "mllm-b9c307020b"}


def header(patch: Path, key: str) -> str:
    m = re.search(rf"^# {key}: (.+)$", patch.read_text(), re.M)
    return m.group(1).strip() if m else ""


def target(patch: Path) -> str:
    return header(patch, "target").split()[0] if header(patch, "target") else "sglang"


@pytest.fixture(scope="module")
def pinned(tmp_path_factory) -> Path:
    if importlib.util.find_spec("sglang") is None:
        pytest.skip(NO_SGLANG)
    dest = tmp_path_factory.mktemp("sglang") / "pinned"
    done = subprocess.run(["bash", str(REPO / "ci/engine-gate/make-sglang-branch.sh"),
                           str(dest), "0.5.24.dev0", sys.executable],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return dest


def pinned_tree(patch: Path, request) -> Path:
    """The pinned tree ``patch`` applies to, read-only (a dry run needs no copy), or skip."""
    t = target(patch)
    if t == "sglang":
        return request.getfixturevalue("pinned")
    if t == "vllm":
        spec = importlib.util.find_spec("vllm")
        if spec is None:
            pytest.skip("vllm is not installed in this Python (bash ci/upstream/vllm-setup.sh "
                        "builds .venv-vllm, where the vLLM suite runs this)")
        return Path(spec.submodule_search_locations[0]).parent
    src = snapshot(SNAPSHOTS[t])
    if not src.is_dir():
        pytest.skip(f"the snapshot {SNAPSHOTS[t]} is absent ({src})")
    return src


def test_the_corpus_has_its_reverts():
    names = {p.stem for p in REVERTS}
    assert {"sglang-22862-free-tail", "sglang-30986-finalize-load-back",
            "sglang-22790-abort-saves-turn", "sglang-10637-insert-value-cut",
            "vllm-11565-touch-after-check", "vllm-42656-hashless-to-tail",
            "lightllm-1348-root-in-evict-set", "pymllm-2cf50f40-split-insert-parent"} <= names, \
        names
    assert {target(p) for p in REVERTS} <= {"sglang", "vllm", "lightllm", "pymllm"}


@pytest.mark.parametrize("patch", REVERTS, ids=lambda p: p.stem)
def test_each_revert_applies_cleanly_and_says_what_it_reverts(patch, request):
    from invariants.properties import PROPERTIES

    assert re.search(r"PR #\d+", header(patch, "upstream")), f"{patch.name}: no upstream PR"
    prop = header(patch, "protects").split()[0] if header(patch, "protects") else ""
    assert prop in {p.name for p in PROPERTIES}, f"{patch.name}: protects {prop!r}?"
    tree = pinned_tree(patch, request)
    done = subprocess.run(["patch", "-p1", "--dry-run", "-d", str(tree), "-i", str(patch)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "offset" not in done.stdout and "fuzz" not in done.stdout, \
        done.stdout + done.stderr


def gate(src: Path, corpus: Path, variant: str, examples: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "KVCHECK_OP_DEADLINE": "30"}
    env.pop("HYPOTHESIS_PROFILE", None)
    argv = [sys.executable, "-m", "state_machines", "gate", "--target", "sglang", "--src",
            str(src), "--variant", variant, "--max-examples", str(examples), "--corpus",
            str(corpus), "--stop-on-first", "--budget", "100"]
    return subprocess.run(argv, cwd=corpus.parent, env=env, capture_output=True, text=True,
                          timeout=600)


def test_a_reverted_fix_fails_the_gate_on_its_property(pinned, tmp_path):
    import shutil

    name, variant, examples = GATED
    patch = REPO / "ci/engine-gate/reverts" / f"{name}.patch"
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "split.json").write_text(json.dumps(
        {"format": "kvcheck-trace", "version": 1, "variant": "radix", "fault": None,
         "params": {"page_size": 1}, "ops": [{"op": "insert", "tokens": [1, 2]},
                                             {"op": "insert", "tokens": [1, 2, 3]}],
         "meta": {}}))
    clean = gate(pinned, corpus, variant, examples)
    assert clean.returncode == 0, clean.stdout[-3000:] + clean.stderr[-2000:]
    branch = tmp_path / "reverted"
    shutil.copytree(pinned, branch)
    done = subprocess.run(["patch", "-p1", "-d", str(branch), "-i", str(patch)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    broken = gate(branch, corpus, variant, examples)
    out = broken.stdout + broken.stderr
    assert broken.returncode == 1, out[-4000:]
    want = header(patch, "protects").split()[0]
    assert f"property broken: {want}" in broken.stdout, out[-4000:]
    assert "harness error:" not in out, out[-4000:]
