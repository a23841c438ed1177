"""A trace as data: ``Trace`` (variant, target, fault, parameters, ops, violation) and how it is
named and written.  Reading one back (``load_trace``, which checks every name against the
variant registry) is ``trace.py``'s; this half imports no variant, so ``run.py`` -- below the
variants -- can record traces without an import circle.  ``trace.py`` re-exports these names.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from caches.target import DECLINE, Identity
from state_machines.ops import Op

FORMAT = "kvcheck-trace"
VERSION = 1


class TraceError(ValueError):
    """A trace file that cannot be used (unreadable, not JSON, wrong shape, unknown names)."""


@dataclass
class Trace:
    variant: str
    params: dict
    ops: list[Op]
    fault: str | None = None
    target: str = "reference"
    violation: dict | None = None  # {"property", "message", "details", "step"}
    meta: dict = field(default_factory=dict)
    identity: Identity | None = None  # the code the target ran (engine, version, source)
    known_findings: str = DECLINE  # how the run treated known upstream findings
    src: str | None = None  # the engine checkout a --src target loaded (informational)

    def to_json(self) -> dict:
        out = {"format": FORMAT, "version": VERSION, "variant": self.variant,
               "target": self.target, "fault": self.fault, "params": self.params,
               "ops": [op.to_json() for op in self.ops], "violation": self.violation,
               "meta": self.meta, "known_findings": self.known_findings}
        if self.identity is not None:
            out["target_identity"] = self.identity.to_json()
        if self.src is not None:
            out["src"] = self.src
        return out

    def name(self) -> str:
        """``<variant>-<hash>``, with the target and its identity for an upstream target
        (``radix-sglang-0.5.12.post1-1a2b3c4d-<hash>``): two runs against two different
        sources never share a name."""
        if self.target == "reference" or self.identity is None:
            return f"{self.variant}-{self.digest()}"
        label = self.identity.label()
        return f"{self.variant}-{self.target}-{label}-{self.digest()}"

    def digest(self) -> str:
        core = {"variant": self.variant, "target": self.target, "fault": self.fault,
                "params": self.params, "ops": [o.to_json() for o in self.ops]}
        if self.target != "reference" and self.identity is not None:
            core["source"] = self.identity.source
        core = json.dumps(core, sort_keys=True)
        return hashlib.sha256(core.encode()).hexdigest()[:10]

    def save(self, out_dir: str | os.PathLike) -> Path:
        """Write ``<name>.json`` into ``out_dir`` (atomically); returns the path.

        A found trace is never lost: if ``out_dir`` cannot be written (checked before a run,
        but a disk can fill up), it goes to a fresh temporary folder and stderr says where."""
        try:
            return self._save(Path(out_dir))
        except OSError as exc:
            import sys
            import tempfile

            path = self._save(Path(tempfile.mkdtemp(prefix="kvcheck-traces-")))
            print(f"kvcheck: cannot write the trace into {out_dir} ({exc.strerror or exc}); "
                  f"saved it to {path} instead", file=sys.stderr, flush=True)
            return path

    def _save(self, out: Path) -> Path:
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{self.name()}.json"
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        os.replace(tmp, path)
        return path
