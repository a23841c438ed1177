"""The target seam: what an engine provides so kvcheck's machines can drive its cache.

A *target* is one engine's caches (kvcheck's own reference models, SGLang's real classes, a
LightLLM checkout, your fork) behind the subjects the machines drive.  A package makes one
available by naming a ``Target`` object under the entry-point group ``kvcheck.targets``::

    [project.entry-points."kvcheck.targets"]
    mycache = "mycache_kvcheck:TARGET"

and from then on every kvcheck command takes ``--target mycache`` -- fuzz, replay, diff, gate,
nightly, coverage, check, bench, list -- with no edit to kvcheck.  ``docs/adapters.md`` is the
guide; ``caches/protocol.py`` says what the subject a builder returns must provide per variant.

A target says three things beside its builders:

* whether it can be used here (``unavailable(src)``: a *missing environment* only -- the engine
  is not installed, the checkout path has no such module; a bug in the adapter is never
  "unavailable", it surfaces as the error it is);
* which source it loads (``identify(src)`` -> ``Identity``: engine, version and a commit or a
  content hash of the files), recorded in every trace so a replay can say when it runs
  against different code;
* whether it takes an engine checkout (``takes_src``: ``--src PATH``), and whether it also
  runs without one, on the installed engine (``src_optional``).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable, Mapping

# how an upstream subject treats ops that would only re-find a recorded upstream finding:
# ``decline`` every one, ``find`` (drive) every one, or ``find=ID[,ID...]``: drive those and
# decline the rest (ids as the target declares them per variant: ``Target.findings``)
DECLINE, FIND = "decline", "find"
KNOWN_FINDINGS = (DECLINE, FIND)


def parse_known_findings(text) -> str:
    """The ``--known-findings`` setting in its normal form (``find=F1,R2``: ids upper-case,
    sorted, no repeats); ``ValueError`` for a malformed one."""
    if not isinstance(text, str):
        raise ValueError(f"--known-findings must be a string, got {text!r}")
    if text in KNOWN_FINDINGS:
        return text
    head, sep, rest = text.partition("=")
    ids = [i.strip().upper() for i in rest.split(",")] if sep else []
    if head.strip() != FIND or not ids or not all(i.isalnum() for i in ids):
        raise ValueError(f"--known-findings {text!r}: expected decline, find or "
                         "find=ID[,ID...] (e.g. find=F1,R2)")
    return FIND + "=" + ",".join(sorted(set(ids)))


def driven_findings(setting: str) -> frozenset | None:
    """The ids a setting drives: None for all (``find``), an empty set for ``decline``."""
    setting = parse_known_findings(setting)
    if setting == FIND:
        return None
    if setting == DECLINE:
        return frozenset()
    return frozenset(setting.split("=", 1)[1].split(","))


def finds(setting: str, finding: str) -> bool:
    """Whether a run with ``setting`` drives the known finding ``finding`` (e.g. ``"F1"``)
    instead of declining the ops that would only re-find it."""
    ids = driven_findings(setting)
    return ids is None or finding in ids


class TargetUnavailable(RuntimeError):
    """The target's environment is missing here (not an adapter bug)."""


class FaultNotInjectable(KeyError):
    """The target has no form of the asked-for catalogued fault."""



@dataclass(frozen=True)
class Param:
    """A variant's (or a target's own) integer parameter: default and range."""

    default: int
    low: int
    high: int
    doc: str

@dataclass(frozen=True)
class Identity:
    """Which code a subject runs: recorded in traces, compared on replay.

    ``source`` is the engine's code: ``git:<commit>`` of the engine's own checkout (the
    folder given, never a repository around it), with ``+dirty.<hash>`` when files the target
    loads differ from that commit, or ``sha256:<hash>`` of those files (an installed engine, a
    folder that is no checkout).  ``adapter`` is the kvcheck code that drives it (a hash of the
    target's adapter package), so a replay can tell "the engine changed" from "the adapter
    changed".  ``note`` says what the run should be read with (an engine version newer than
    the newest one kvcheck was tested on).  Traces written before ``adapter``/``note``
    existed load with them empty."""

    engine: str  # "kvcheck", "sglang", "lightllm", ...
    version: str  # the engine's version ("0.5.12.post1"), or "" when it has none
    source: str  # "git:<commit>[+dirty.<hash>]" or "sha256:<hash of the loaded files>"
    adapter: str = ""  # "sha256:<hash of the adapter's files>", "" when not recorded
    note: str = ""

    def label(self) -> str:
        """Short and file-name safe: ``sglang-0.5.12.post1-1a2b3c4d``."""
        tag = self.source.split(":", 1)[-1][:8]
        parts = [self.engine] + ([self.version] if self.version else []) + [tag]
        return "-".join("".join(c if c.isalnum() or c in "._" else "_" for c in p)
                        for p in parts)

    def describe(self) -> str:
        """One line for a run header or a summary: ``sglang 0.5.24.dev0 sha256:...``."""
        return " ".join(p for p in (self.engine, self.version, self.source) if p) + (
            f" (adapter {self.adapter})" if self.adapter else "")

    def to_json(self) -> dict:
        out = {"engine": self.engine, "version": self.version, "source": self.source}
        out.update({k: v for k, v in (("adapter", self.adapter), ("note", self.note)) if v})
        return out

    @classmethod
    def from_json(cls, raw) -> "Identity | None":
        if not isinstance(raw, dict):
            return None
        vals = [raw.get(k) for k in ("engine", "version", "source")]
        extra = [raw.get(k, "") for k in ("adapter", "note")]
        if not all(isinstance(v, str) for v in vals + extra):
            return None
        return cls(*vals, *extra)


def content_hash(files: Iterable[str | os.PathLike]) -> str:
    """``sha256:<hex>`` over the files' names and bytes (sorted by name)."""
    h = hashlib.sha256()
    for f in sorted(Path(p) for p in files):
        h.update(f.name.encode() + b"\0")
        try:
            h.update(f.read_bytes())
        except OSError:
            h.update(b"<missing>")
    return "sha256:" + h.hexdigest()[:16]


def git_commit(path: str | os.PathLike) -> str | None:
    """The commit checked out at ``path`` -- the folder itself is the checkout (it holds
    ``.git``); a folder inside some other repository is not (read without running git)."""
    d = Path(path).resolve()
    git = d / ".git"
    if git.is_file():  # a worktree: "gitdir: ..."
        text = git.read_text().strip()
        if text.startswith("gitdir:"):
            git = (d / text.split(":", 1)[1].strip()).resolve()
    if not git.is_dir():
        return None
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref:"):
            return head
        ref = head.split(":", 1)[1].strip()
        common = git / (git / "commondir").read_text().strip() \
            if (git / "commondir").exists() else git
        for ref_file in (git / ref, common / ref):
            if ref_file.exists():
                return ref_file.read_text().strip()
        for packed in (git / "packed-refs", common / "packed-refs"):
            if packed.exists():
                for line in packed.read_text().splitlines():
                    if line.endswith(" " + ref):
                        return line.split()[0]
        return None
    except OSError:
        return None


def dirty_hash(checkout: str | os.PathLike, files: Iterable[str | os.PathLike]) -> str | None:
    """A hash of the uncommitted changes (modified, added, untracked) among ``files`` in git
    checkout ``checkout`` (``git status``), None when they are all as committed, or
    ``"unknown"`` when git cannot say (not installed, not a repository)."""
    import subprocess

    root = Path(checkout).resolve()
    rel = sorted({str(Path(f).resolve().relative_to(root)) for f in files
                  if root in Path(f).resolve().parents})
    if not rel:
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "-z",
                              "--untracked-files=all", "--", *rel], capture_output=True,
                             timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    changed = sorted({e[3:].decode(errors="replace") for e in out.split(b"\0") if len(e) > 3})
    if not changed:
        return None
    h = hashlib.sha256()
    for name in changed:
        h.update(name.encode() + b"\0")
        try:
            h.update((root / name).read_bytes())
        except OSError:
            h.update(b"<deleted>")
    return h.hexdigest()[:12]


def source_identity(checkout: str | os.PathLike | None,
                    files: Iterable[str | os.PathLike]) -> str:
    """``git:<commit>[+dirty.<hash>]`` when ``checkout`` itself is a git checkout (the hash
    covers the uncommitted changes to ``files``), else ``content_hash(files)``."""
    files = list(files)
    commit = git_commit(checkout) if checkout is not None else None
    if not commit:
        return content_hash(files)
    dirty = dirty_hash(checkout, files)
    return f"git:{commit}" + (f"+dirty.{dirty}" if dirty else "")


def adapter_source(target: "Target") -> str:
    """``sha256:<hash>`` of the kvcheck code that drives ``target``: every ``.py`` file of
    the packages its builders and ``identify`` are defined in."""
    import sys

    dirs = set()
    for fn in (*target.builders.values(), target.identify, target.unavailable):
        mod = sys.modules.get(getattr(fn, "__module__", None) or "")
        if mod is not None and getattr(mod, "__file__", None):
            dirs.add(Path(mod.__file__).resolve().parent)
    return _adapter_hash(frozenset(dirs))


@lru_cache(maxsize=None)
def _adapter_hash(dirs: frozenset) -> str:
    return content_hash(p for d in dirs for p in d.glob("*.py"))


def _always_available(src):
    return None


@dataclass(frozen=True)
class Target:
    """One engine's caches behind kvcheck's subjects (what a ``kvcheck.targets`` entry point
    names).

    ``builders`` maps a variant name to ``build(params, *, fault, device, src,
    known_findings) -> subject``: ``params`` are the variant's checked parameters, ``fault`` a
    catalogued fault id to inject or None (raise ``FaultNotInjectable`` when the engine's code
    has no form of it), ``device`` "cpu"/"cuda", ``src`` the engine checkout (None unless
    ``takes_src``), ``known_findings`` the ``--known-findings`` setting (DECLINE, FIND or
    ``find=ID,...``; ``finds(known_findings, id)`` says whether to drive one).  The subject
    satisfies the variant's protocol in ``caches/protocol.py``.

    ``findings`` maps a variant to the ids of the known upstream findings its subject declines
    (``tests/upstream_findings/<engine>-<variant>-<ID>-*.json``); ``find=ID`` accepts only
    those.
    """

    name: str
    engine: str
    summary: str
    builders: Mapping[str, Callable]
    unavailable: Callable[[str | None], str | None] = _always_available
    identify: Callable[[str | None], Identity] | None = None
    takes_src: bool = False
    # with ``takes_src``: ``--src`` may be left out, the installed engine is then the one
    # driven (SGLang, vLLM); False: the target needs a checkout (LightLLM, pymllm)
    src_optional: bool = False
    setup_hint: str = ""
    faults: Mapping[str, tuple] = field(default_factory=dict)  # variant -> injectable ids
    # why one variant cannot be used here although the target can (the installed engine
    # release lacks it): ``variant_unavailable(variant, src) -> reason | None``
    variant_unavailable: Callable[[str, str | None], str | None] | None = None
    # why one regime of a usable variant cannot run here (the release lacks that part, e.g.
    # a tier): ``params_unavailable(variant, params) -> reason | None``; the CLI leaves such a
    # regime out of the variant's defaults and refuses it when asked for by --param
    params_unavailable: Callable[[str, dict], str | None] | None = None
    # the nearest regime it can run instead of one ``params_unavailable`` refuses:
    # ``params_substitute(variant, params) -> params | None``; the CLI runs it in place of the
    # refused one (saying so) unless a parameter it changes was asked for by --param
    params_substitute: Callable[[str, dict], dict | None] | None = None
    # per-target parameters: variant -> {name: Param}; a name the
    # variant has narrows its range/default for this target (e.g. the page sizes the engine
    # supports), a new name adds an engine option (a feature switch) its builder receives
    params: Mapping[str, Mapping] = field(default_factory=dict)
    # per-target regimes: variant -> the regimes (param overrides) this target runs instead of
    # the variant's own
    regimes: Mapping[str, tuple] = field(default_factory=dict)
    findings: Mapping[str, tuple] = field(default_factory=dict)  # variant -> finding ids

    def known_findings(self, variant: str, setting: str, strict: bool = True) -> str:
        """``setting`` checked against the findings ``variant`` declares (normal form);
        ``ValueError`` naming the known ids for an id the target does not have -- or, not
        ``strict`` (a job over many targets), that id left out (``decline`` if none is left)."""
        setting = parse_known_findings(setting)
        ids = driven_findings(setting)
        known = tuple(self.findings.get(variant, ()))
        unknown = sorted(ids - set(known)) if ids else []
        if unknown and not strict:
            kept = sorted(ids & set(known))
            return FIND + "=" + ",".join(kept) if kept else DECLINE
        if unknown:
            raise ValueError(f"--known-findings {setting}: target {self.name!r} has no known "
                             f"finding {', '.join(unknown)} for {variant} (known: "
                             f"{', '.join(known) or 'none'})")
        return setting

    @property
    def variants(self) -> tuple:
        return tuple(self.builders)

    def identity(self, src: str | None = None) -> Identity:
        """The engine code (``identify``) and the adapter code (``adapter_source``) a run
        with ``src`` drives."""
        ident = Identity(self.engine, "", "unknown:") if self.identify is None \
            else self.identify(src)
        return ident if ident.adapter else replace(ident, adapter=adapter_source(self))

    def build(self, variant: str, params: dict, *, fault: str | None = None,
              device: str | None = None, src: str | None = None,
              known_findings: str = DECLINE):
        if variant not in self.builders:
            raise KeyError(f"target {self.name!r} has no {variant!r} variant; it has "
                           f"{', '.join(self.builders) or 'none'}")
        known_findings = self.known_findings(variant, known_findings, strict=False)
        if src is not None and not self.takes_src:
            raise ValueError(f"target {self.name!r} takes no --src (it loads an installed "
                             f"{self.engine})")
        why = self.unavailable(src)
        if not why and self.variant_unavailable is not None:
            why = self.variant_unavailable(variant, src)
        if not why and self.params_unavailable is not None:
            why = self.params_unavailable(variant, params)
        if why:
            raise TargetUnavailable(why)
        return self.builders[variant](params, fault=fault, device=device, src=src,
                                      known_findings=known_findings)
