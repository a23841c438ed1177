"""docs/gating.md's recipes, driven: each engine's gate line (read from the doc, so the two
cannot drift apart) against an unmodified copy of the engine -- exit 0, the engine's code
gated -- and against a copy with one planted bug -- exit 1 on a property.  Engines whose
environment (the recipe's set-up line) is absent here are skipped with the reason: SGLang runs
in the upstream suite (``.venv-upstream``), LightLLM and pymllm in the core suite (their
checkouts are the ``../shared/upstream`` snapshots), vLLM in ``.venv-vllm`` (the SGLang and vLLM
checkouts are the pinned wheels' Python trees laid out as checkouts).

The budgets are cut to fit CI (one variant, a few dozen examples, a one-trace corpus): the
gate line's own flags stay, the test appends its narrowing flags after them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.upstream.snapshots import snapshot

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "gating.md"
SPLIT = [{"op": "insert", "tokens": [1, 2]}, {"op": "insert", "tokens": [1, 2, 3]}]


@dataclass(frozen=True)
class Recipe:
    section: str  # the doc's "## <section>" heading starts with this
    target: str
    variant: str
    max_examples: int
    plant_file: str  # relative to the copy
    plant_old: str  # occurs exactly once in plant_file
    plant_new: str


RECIPES = {
    "sglang": Recipe(
        "SGLang", "sglang", "radix", 60,
        "python/sglang/srt/mem_cache/unified_cache/components/full.py",
        "                self.tree_core.component_protected_size_[ct] -= key_len\n",
        "                pass  # planted: a released lock leaves its tokens protected\n"),
    "pymllm": Recipe(
        "pymllm", "pymllm", "radix", 60, "pymllm/mem_cache/radix_cache.py",
        "                self._protected_size -= len(cur.key)\n",
        "                pass  # planted: a released lock leaves its tokens protected\n"),
    "vllm": Recipe(
        "vLLM", "vllm", "block-hash", 60, "vllm/v1/core/block_pool.py",
        "            block.ref_cnt -= 1\n            if block.ref_cnt == 0:\n"
        "                if block.block_hash is None or not self.enable_caching:\n",
        "            block.ref_cnt -= 0  # planted: a freed block keeps its reference\n"
        "            if block.ref_cnt == 0:\n"
        "                if block.block_hash is None or not self.enable_caching:\n"),
    "lightllm": Recipe(
        "LightLLM", "lightllm", "paged-bigpage", 60,
        "lightllm/server/router/dynamic_prompt/linear_att_radix_cache.py",
        "            if node.ref_counter == 1:\n"
        "                self.refed_tokens_num.arr[0] -= len(node.token_mem_index_value)\n",
        "            if node.ref_counter == 1:\n"
        "                pass  # planted: a released ref keeps its tokens counted as referenced\n"),
}


def doc_lines(section: str) -> dict[str, str]:
    """The ``# set-up`` and ``# gate`` command lines of the doc's section ``section``."""
    text = DOC.read_text()
    m = re.search(rf"^## {re.escape(section)}\b.*?^```bash\n(.*?)^```", text, re.M | re.S)
    assert m, f"docs/gating.md has no '## {section}' section with a bash block"
    out, want = {}, None
    for line in m.group(1).splitlines():
        if line.startswith("#"):
            tag = re.match(r"# (set-up|gate)\b", line)
            want = tag.group(1) if tag else None
        elif line.strip() and want in ("set-up", "gate") and want not in out:
            out[want] = line.strip()
    assert set(out) == {"set-up", "gate"}, f"'## {section}' lacks a set-up or a gate line"
    return out


def gate_argv(recipe: Recipe, checkout: Path, corpus: Path, *extra: str) -> list[str]:
    """The doc's gate line as this Python runs it, pointed at ``checkout``, narrowed."""
    words = shlex.split(doc_lines(recipe.section)["gate"])
    assert words[0].endswith("kvcheck") and words[1] == "gate", words
    assert f"--target={recipe.target}" in "=".join(words) or \
        words[words.index("--target") + 1] == recipe.target
    words = [str(checkout) if w.startswith("~/") else w for w in words[2:]]
    assert str(checkout) in words, "the gate line names no checkout (~/src/...)"
    return [sys.executable, "-m", "state_machines", "gate", *words, "--variant",
            recipe.variant, "--max-examples", str(recipe.max_examples), "--corpus", str(corpus),
            *extra]


def run_gate(recipe, checkout, corpus, *extra) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "KVCHECK_OP_DEADLINE": "30"}
    env.pop("HYPOTHESIS_PROFILE", None)
    return subprocess.run(gate_argv(recipe, checkout, corpus, *extra), cwd=corpus.parent, env=env,
                          capture_output=True, text=True, timeout=900)


def plant(recipe: Recipe, checkout: Path) -> None:
    f = checkout / recipe.plant_file
    text = f.read_text()
    assert text.count(recipe.plant_old) == 1, f"the plant site in {f} is not unique"
    f.write_text(text.replace(recipe.plant_old, recipe.plant_new))


def sglang_copy(dest: Path) -> str | None:
    """The pinned wheel laid out as a branch (ci/engine-gate/make-sglang-branch.sh), or why
    not (the recipe's set-up, .venv-upstream, is absent)."""
    if importlib.util.find_spec("sglang") is None:
        return "sglang is not installed in this Python (the recipe's set-up line builds " \
               ".venv-upstream; the upstream suite runs this there)"
    done = subprocess.run(["bash", str(REPO / "ci/engine-gate/make-sglang-branch.sh"),
                           str(dest), "0.5.24.dev0", sys.executable],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return None


def vllm_copy(dest: Path) -> str | None:
    """The installed vLLM's Python tree laid out as a checkout (``vllm/...``, no compiled
    extension, no bytecode), or why not (the recipe's set-up, .venv-vllm, is absent)."""
    from caches.adapters.vllm import loader

    spec = importlib.util.find_spec("vllm")
    if spec is None or loader.unavailable_reason():
        return "vllm is not installed in this Python (the recipe's set-up line builds " \
               ".venv-vllm, where this test runs it)"
    shutil.copytree(spec.submodule_search_locations[0], dest / "vllm",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    return None


def snapshot_copy(name: str, loader_module: str, dest: Path) -> str | None:
    if any(importlib.util.find_spec(engine) for engine in ("sglang", "vllm")):
        return "this is an engine env (.venv-upstream, .venv-vllm): the core suite runs it"
    src = snapshot(name)
    if not src.is_dir():
        return f"the snapshot {name} is absent ({src})"
    loader = importlib.import_module(loader_module)  # (importlib.util binds importlib)
    why = loader.unavailable_reason(str(src))
    if why:
        return why
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", ".git"))
    return None


COPIES = {
    "sglang": sglang_copy,
    "vllm": vllm_copy,
    "pymllm": lambda d: snapshot_copy("mllm-b9c307020b", "caches.adapters.pymllm.loader", d),
    "lightllm": lambda d: snapshot_copy("lightllm-87881ae7ca",
                                        "caches.adapters.lightllm.loader", d),
}


@pytest.fixture
def corpus(tmp_path) -> Path:
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "split.json").write_text(json.dumps(
        {"format": "kvcheck-trace", "version": 1, "variant": "radix", "fault": None,
         "params": {"page_size": 1}, "ops": SPLIT, "meta": {}}))
    return d


@pytest.mark.parametrize("engine", sorted(RECIPES))
def test_recipe_gates_a_clean_copy_and_fails_a_planted_bug(engine, tmp_path, corpus):
    recipe = RECIPES[engine]
    checkout = tmp_path / f"{engine}-checkout"
    why = COPIES[engine](checkout)
    if why:
        pytest.skip(f"{engine} not driven here: {why}")
    clean = run_gate(recipe, checkout, corpus)
    assert clean.returncode == 0, clean.stdout[-3000:] + clean.stderr[-2000:]
    assert f"engine code gated: {recipe.target} (" in clean.stdout
    plant(recipe, checkout)
    # (the first failure is the verdict asked for: not every distinct one, each shrunk)
    broken = run_gate(recipe, checkout, corpus, "--stop-on-first")
    assert broken.returncode == 1, broken.stdout[-3000:] + broken.stderr[-2000:]
    assert "property broken: " in broken.stdout, broken.stdout[-3000:]
    assert "was not gated" not in broken.stdout


def test_every_recipe_section_has_a_set_up_and_a_gate_line():
    for section in ("SGLang", "vLLM", "LightLLM", "pymllm", "TokenSpeed"):
        assert "kvcheck gate --target" in doc_lines(section)["gate"]
    tokenspeed = DOC.read_text().split("## TokenSpeed", 1)[1].split("\n## ", 1)[0]
    assert "engines/tokenspeed.md" in tokenspeed  # its build times and drivable checkouts
