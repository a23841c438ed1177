"""Record what a driver calls on an engine's objects, as straight-line Python.

``CallRecorder.instrument(obj, name)`` gives ``obj`` a recording subclass of its own class (same
identity, same ``isinstance``, same behaviour): while recording is on, every method call and
attribute write made on it *from outside the engine* -- by the adapter, not by the engine's
own code inside such a call -- is written as a line of code.  Arguments become code: objects
already named (the instrumented ones, earlier results) by their name, a tree node by its path
from a named root (``cache.root_node.children[0]``), ints/strings/lists/tuples/slices as
literals, tensors as ``torch.tensor([...], dtype=...)``, enums by member, and any other object
whose constructor parameters are its attributes (dataclasses, ``RadixKey``) as a constructor
call.  A call's result gets a name (``v3``) unless it is a plain value (then a comment says
it); a result's dataclass/named-tuple fields are named through it (``v3.last_device_node``).

Nothing here knows an engine; ``state_machines/report.py`` turns the lines into a script.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
from array import array

_PLAIN = (bool, int, float, str, type(None))


class ReportError(Exception):
    """The run cannot be written as a stand-alone script (says what and why)."""


@dataclasses.dataclass
class Line:
    code: str
    raised: str | None = None  # the exception class name the recorded call raised


class CallRecorder:
    def __init__(self, node_fields=None):
        self.parent_field, self.children_field = (
            (node_fields.parent, node_fields.children) if node_fields is not None
            else ("parent", "children"))
        self.lines: list[Line | str] = []  # str: a step marker line written by the caller
        self.imports: dict[str, set[str]] = {}  # module -> names
        self.active = False
        self._depth = 0
        self._names: dict[int, str] = {}
        self._fixed: set[int] = set()  # ids named by name(): instrumented objects, anchors
        self._keep: list = []  # objects named here stay alive (their ids stay theirs)
        self._swapped: list[tuple[object, type]] = []
        self._results = 0
        self._made: dict[str, int] = {}  # construction name -> how many so far

    # -- naming -----------------------------------------------------------------------------
    def name(self, obj, expr: str) -> None:
        """Call ``obj`` ``expr`` in the script (a name it keeps: results never rename it)."""
        self._fixed.add(id(obj))
        if id(obj) not in self._names:
            self._names[id(obj)] = expr
            self._keep.append(obj)

    def need(self, cls) -> str:
        """Import ``cls`` in the script; returns the name it goes by there."""
        self.imports.setdefault(cls.__module__, set()).add(cls.__qualname__.split(".")[0])
        return cls.__qualname__

    # -- instrumenting ------------------------------------------------------------------------
    def instrument(self, obj, name: str) -> None:
        self.name(obj, name)
        cls = type(obj)
        rec = self

        def __getattribute__(self_, attr):
            value = cls.__getattribute__(self_, attr)
            if (rec.active and rec._depth == 0 and callable(value)
                    and not (attr.startswith("__") or isinstance(value, type))):
                return rec._wrap(f"{rec._names[id(self_)]}.{attr}", value)
            return value

        def __setattr__(self_, attr, value):
            if rec.active and rec._depth == 0:
                rec.lines.append(Line(f"{rec._names[id(self_)]}.{attr} = {rec.code(value)}"))
            cls.__setattr__(self_, attr, value)

        sub = type(cls.__name__, (cls,), {"__getattribute__": __getattribute__,
                                          "__setattr__": __setattr__, "__slots__": (),
                                          "__module__": cls.__module__})
        obj.__class__ = sub
        self._swapped.append((obj, cls))

    def restore(self) -> None:
        """Stop recording and give every instrumented object its own class back."""
        self.active = False
        for obj, cls in reversed(self._swapped):
            obj.__class__ = cls
        self._swapped.clear()

    def construct(self, name: str, cls, args: tuple, kwargs: dict):
        """``cls(*args, **kwargs)`` made by the driver while recording: written as a
        construction line under a fresh ``name`` (``req``, ``req_2``, ...), then recorded."""
        text = self.constructor_call(cls, args, kwargs)
        self._depth += 1
        try:
            obj = cls(*args, **kwargs)
        finally:
            self._depth -= 1
        self._made[name] = self._made.get(name, 0) + 1
        var = name if self._made[name] == 1 else f"{name}_{self._made[name]}"
        self.lines.append(Line(f"{var} = {text}"))
        self.instrument(obj, var)
        return obj

    def constructor_call(self, cls, args: tuple, kwargs: dict) -> str:
        return f"{self.need(cls)}(" + ", ".join(
            [self.code(a) for a in args] + [f"{k}={self.code(v)}" for k, v in kwargs.items()]) \
            + ")"

    def _wrap(self, target: str, method):
        def call(*args, **kwargs):
            parts = [self.code(a) for a in args] + [f"{k}={self.code(v)}"
                                                    for k, v in kwargs.items()]
            text = f"{target}({', '.join(parts)})"
            self._depth += 1
            try:
                out = method(*args, **kwargs)
            except Exception as exc:
                self.lines.append(Line(text, raised=type(exc).__name__))
                raise
            finally:
                self._depth -= 1
            self.lines.append(Line(self._result(text, out)))
            return out
        return call

    def _result(self, text: str, out) -> str:
        if isinstance(out, _PLAIN):
            return text if out is None else f"{text}  # -> {out!r}"
        if id(out) in self._names:
            return f"{text}  # -> {self._names[id(out)]}"
        self._results += 1
        var = f"v{self._results}"
        self._keep.append(out)
        self._names[id(out)] = var
        named = set()
        for f, value in _fields(out):  # the newest result's first field naming an object
            if not isinstance(value, _PLAIN) and id(value) not in self._fixed | named:
                named.add(id(value))
                self._keep.append(value)
                self._names[id(value)] = f"{var}.{f}"
        return f"{var} = {text}"

    # -- values as code -----------------------------------------------------------------------
    def code(self, v) -> str:
        if id(v) in self._names:
            return self._names[id(v)]
        if isinstance(v, enum.Enum):
            return f"{self.need(type(v))}.{v.name}"
        if isinstance(v, _PLAIN):
            return repr(v)
        if isinstance(v, list):
            return "[" + ", ".join(self.code(x) for x in v) + "]"
        if isinstance(v, tuple) and not _fields(v):
            inner = ", ".join(self.code(x) for x in v)
            return f"({inner},)" if len(v) == 1 else f"({inner})"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{self.code(k)}: {self.code(x)}" for k, x in v.items()) + "}"
        if isinstance(v, slice):
            return f"slice({self.code(v.start)}, {self.code(v.stop)}, {self.code(v.step)})"
        if isinstance(v, array):
            self.imports.setdefault("array", set()).add("array")
            return f"array({v.typecode!r}, {v.tolist()!r})"
        torch_code = _torch_code(v)
        if torch_code is not None:
            self.imports.setdefault("", set()).add("torch")
            return torch_code
        path = self._node_path(v)
        if path is not None:
            return path
        return self._constructor(v)

    def _node_path(self, v) -> str | None:
        """A tree node as its path of child keys from a named node (a root)."""
        steps, node, seen = [], v, 0
        while id(node) not in self._names:
            parent = getattr(node, self.parent_field, None)
            children = getattr(parent, self.children_field, None)
            if not isinstance(children, dict) or seen > 10_000:
                return None
            key = next((k for k, c in children.items() if c is node), _MISSING)
            if key is _MISSING:
                return None
            steps.append(key)
            node, seen = parent, seen + 1
        if not steps:
            return None
        return self._names[id(node)] + "".join(f".{self.children_field}[{self.code(k)}]"
                                               for k in reversed(steps))

    def _constructor(self, v) -> str:
        cls = type(v)
        if cls.__module__ in ("builtins", "__main__") or cls.__module__.split(".")[0] in (
                "caches", "state_machines", "invariants", "tests"):
            raise ReportError(f"the driver passed a {cls.__module__}.{cls.__qualname__} "
                              "(not an engine object) to the engine; it cannot be written "
                              "without kvcheck")
        try:
            params = list(inspect.signature(cls).parameters.values())
        except (TypeError, ValueError):
            params = None
        if params is None or any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            raise ReportError(f"cannot write a {cls.__module__}.{cls.__qualname__} as code "
                              "(no constructor that takes its attributes)")
        defaults = _dataclass_defaults(v)
        args = []
        for p in params:
            if not hasattr(v, p.name):
                if p.default is inspect.Parameter.empty:
                    raise ReportError(f"cannot write a {cls.__module__}.{cls.__qualname__} "
                                      f"as code (no attribute for its parameter {p.name})")
                continue
            value = getattr(v, p.name)
            if _is_default(value, defaults.get(p.name, p.default)):
                continue
            args.append(f"{p.name}={self.code(value)}")
        return f"{self.need(cls)}({', '.join(args)})"


_MISSING = object()


def _fields(v) -> list[tuple[str, object]]:
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return [(f.name, getattr(v, f.name)) for f in dataclasses.fields(v)]
    if isinstance(v, tuple) and hasattr(type(v), "_fields"):
        return list(zip(type(v)._fields, v))
    return []


def _dataclass_defaults(v) -> dict:
    """A dataclass's field defaults, default factories called (else {})."""
    if not dataclasses.is_dataclass(v):
        return {}
    out = {}
    for f in dataclasses.fields(v):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _is_default(value, default) -> bool:
    if default is inspect.Parameter.empty:
        return False
    if value is default:
        return True
    if isinstance(value, _PLAIN) and isinstance(default, _PLAIN):
        return type(value) is type(default) and value == default
    if isinstance(value, (dict, list, tuple, set)) and not value and type(value) is type(default):
        return True
    return False


def _torch_code(v) -> str | None:
    try:
        import torch
    except ImportError:
        return None
    if isinstance(v, torch.Tensor):
        return f"torch.tensor({v.tolist()!r}, dtype={v.dtype})"
    if isinstance(v, torch.dtype):
        return str(v)
    if isinstance(v, torch.device):
        return f"torch.device({str(v)!r})"
    return None
