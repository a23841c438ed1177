"""What an upstream subject tells ``kvcheck report`` so a finding can be written as a
stand-alone script over the engine's own classes (``state_machines/report.py`` writes it).

An adapter builds the engine objects it drives through ``Built.make(name, cls, *args)``,
which keeps the construction (class, arguments) next to the object: the report writes that
construction as code, then every call the driver makes on those objects, recorded while the
trace replays (``state_machines/call_recorder.py``).  The subject's ``report_setup()`` returns a
``ReportSetup``: the constructions, the code the script needs before it imports the engine
(import stand-ins), and the checks of each property in the engine's own terms.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class Built:
    """The engine objects an adapter built, in order, with how it built each one.

    ``make`` at construction time adds a step; while ``kvcheck report`` records a replay
    (``recorder`` set and active), an object the adapter makes during an op (a request, a
    session) is written as a construction line where it happens and recorded from then on.
    ``set`` is an attribute the adapter sets on an engine object while building them."""

    def __init__(self):
        self.steps: list[tuple] = []  # ("make", name, obj, cls, args, kwargs) / ("set", ...)
        self.recorder = None  # state_machines.call_recorder.CallRecorder while a report records

    def make(self, name: str, cls, *args, **kwargs):
        rec = self.recorder
        if rec is not None and rec.active:
            return rec.construct(name, cls, args, kwargs)
        obj = cls(*args, **kwargs)
        self.steps.append(("make", name, obj, cls, args, kwargs))
        return obj

    def set(self, obj, attr: str, value) -> None:
        setattr(obj, attr, value)
        self.steps.append(("set", obj, attr, value))

    def objects(self) -> dict:
        return {s[1]: s[2] for s in self.steps if s[0] == "make"}


@dataclass(frozen=True)
class Check:
    """A property in the engine's terms: ``code`` defines a function that raises
    ``Broken(property, message)`` (a class the script defines) when it does not hold;
    ``call`` calls it on the script's objects; ``words`` says it for people."""

    code: str
    call: str
    words: str


@dataclass
class ReportSetup:
    engine: str  # "sglang"
    version: str  # the installed release the script is written for
    driven: str  # the engine class the finding is about, dotted
    built: Built  # the objects the adapter built and how
    checks: dict[str, Check]  # property -> its check in the engine's terms
    preamble: str = ""  # code run before the engine is imported (stand-ins), with its comment
    after_import: str = ""  # code run right after the imports (e.g. a logical clock)
    anchors: dict[str, object] = field(default_factory=dict)  # extra names: expr -> object
    interpreter: str = "python"  # how to run the script (the env that has the release)
    # how the recorder walks the engine's nodes to write a node as its path from a named root
    # (``caches.seam.NodeFields``: ``parent`` and ``children`` by attribute name)
    node_fields: object = None
