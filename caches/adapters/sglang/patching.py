"""Catalogued faults as textual patches of SGLang's real methods (the bad diffs).

A fault's upstream form is a list of ``Patch``es, each replacing ``old`` lines of one upstream
method with ``new`` ones.  The method's source is read from the installed release
(``inspect.getsource``); each ``old`` must occur exactly once, so a release where the method
moved or changed fails loudly instead of testing something else.  The patched source is
compiled in the method's own module globals and installed on a *subclass*
(``RadixCache_R1``...): the real class is never modified, and only a subject built with
``--fault`` uses the subclass.

Each adapter keeps its own table of ``UpstreamFault``s (``faults.py`` for the radix target,
``<variant>_faults.py`` for the others) and calls ``patched_subclass``.  Patch text is written
at class-body indentation (4 spaces), as it appears in the upstream file.
"""

from __future__ import annotations

import __future__
import inspect
import textwrap
from dataclasses import dataclass

from caches.adapters.sglang import loader


@dataclass(frozen=True)
class Patch:
    method: str
    old: str  # lines of the upstream method, at class-body indentation
    new: str


@dataclass(frozen=True)
class UpstreamFault:
    id: str  # the catalogue id (docs/faults.md)
    patches: tuple
    why: str  # one line: where the defect sits in SGLang's code


def _at_method_level(text: str) -> str:
    """getsource+dedent puts the method at column 0; patches are written one level in."""
    return "\n".join(line[4:] if line.startswith("    ") else line
                     for line in text.split("\n"))


def patch_method(cls, method: str, patches, fid: str):
    """``cls.method`` recompiled with ``patches`` applied (a plain function)."""
    func = getattr(cls, method)
    src = textwrap.dedent(inspect.getsource(func))
    for p in patches:
        old, new = _at_method_level(p.old), _at_method_level(p.new)
        if src.count(old) != 1:
            raise LookupError(f"fault {fid}: SGLang {loader.load().version}'s "
                              f"{cls.__name__}.{method} does not contain exactly once:\n{old}")
        src = src.replace(old, new)
    code = compile(src, f"<kvcheck fault {fid}: {cls.__name__}.{method}>", "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    namespace: dict = {}
    exec(code, func.__globals__, namespace)
    return namespace[method]


def patched_subclass(base: type, fault: UpstreamFault) -> type:
    """A subclass of ``base`` with ``fault``'s patches applied, named ``<base>_<id>``."""
    by_method: dict = {}
    for p in fault.patches:
        by_method.setdefault(p.method, []).append(p)
    body = {m: patch_method(base, m, ps, fault.id) for m, ps in by_method.items()}
    body.update(fault_id=fault.id,
                __doc__=f"SGLang {base.__name__} with fault {fault.id}: {fault.why}")
    return type(f"{base.__name__}_{fault.id}", (base,), body)


def lookup(table: dict, not_injectable: dict, fid: str, where: str) -> UpstreamFault:
    """``table[fid]``, or a KeyError that says why there is no upstream form."""
    if fid in not_injectable:
        raise KeyError(f"fault {fid} has no upstream form on SGLang's {where}: "
                       f"{not_injectable[fid]}")
    if fid not in table:
        raise KeyError(f"fault {fid} has no upstream form on SGLang's {where}; injectable: "
                       f"{', '.join(table) or 'none'}")
    return table[fid]
