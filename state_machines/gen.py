"""Op generators: how each op's arguments are produced, written once in the op table.

Every ``OpSpec`` carries its generators (``Gen``); one definition is read three ways:

* ``install_rules`` turns each generator into a Hypothesis ``@rule`` (with its preconditions)
  of the variant's machine -- same rule names and the same draws as hand-written rules;
* ``OpTable.alphabet(params)`` turns the ``small`` values of each argument into the finite
  op set of the exhaustive search (``kvcheck check``);
* ``random_step`` / ``walk`` draw the same generators with a plain ``random.Random`` (the
  native engine's seeded random walks).

Two layers.  A *draw* is one primitive random choice -- ``Ints``, ``Bools``, ``Lists``,
``Tuples``, ``Sampled``, ``.map(f)`` -- that is a Hypothesis strategy or a ``Random`` sample,
and shrinks towards its first value (0, False, the shortest list, the first choice).  An
*argument* (``Arg``) turns named draws into an op argument against the driver's state, may
add a precondition, and lists its ``small`` values for the exhaustive alphabet:

    Drawn(Ints(1, 16), small=(1, 64))   an integer as drawn
    Const(v)                            always v
    Fresh()                             a new id (rid / hid / sid): driver.new_id()
    Among(f)                            f(driver)[pick % len]: an index that shrinks to the
                                        oldest (newest=True: the newest); precondition: f non-empty
    Live() / Held()                     Among(live request ids) / Among(held bare-lock ids)
    Seq(Lists(...))                     a token list as drawn (remember=True: into driver.seen)
    Shared(cut, extra)                  driver.seen[pick] minus its last ``cut`` tokens plus
                                        ``extra``: shrinks towards re-using a whole sequence

``Gen(**args)`` is one generator of its op (a rule), with ``when`` (a precondition on the
driver), ``regime`` (on the params: the rule exists only where it holds), ``shape`` (fix up
arguments that depend on each other) and ``after`` (a hook once the op ran).  An op may have
several generators (radix ``admit`` and ``admit_sharing``) or, where only a steering
``Scenario`` emits it, ``Gen(..., rule=False)`` (alphabet and walks only).  A ``Scenario`` is
the escape hatch for steering that is not one op: named draws and a body that drives several
ops (serve a whole request, a whole turn, a backup then its ack).

A *driver* is what generators read and act on: ``subject``, ``params``, ``seen`` (sequences
used so far), ``notes`` (generator-owned memory), ``new_id()``, ``live()`` and
``do(name, **args)``.  ``KVMachine`` is one; ``Walk`` (below) is the plain one.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from state_machines.ops import Op
from state_machines.run import Run

# -- draws: primitive random choices ------------------------------------------------------------


class Draw:
    def strategy(self):
        raise NotImplementedError

    def sample(self, rnd: random.Random):
        raise NotImplementedError

    def map(self, fn: Callable) -> Draw:
        return Mapped(self, fn)


@dataclass(frozen=True)
class Ints(Draw):
    lo: int
    hi: int

    def strategy(self):
        return st.integers(self.lo, self.hi)

    def sample(self, rnd):
        # ``rnd.randint(lo, hi)`` is ``lo + rnd._randbelow(hi - lo + 1)`` (CPython's
        # randint -> randrange): the same numbers from the same stream, two frames fewer
        width = self.hi - self.lo + 1
        if width <= 0:  # (_randbelow would not return: fail as randint does)
            return rnd.randint(self.lo, self.hi)
        return self.lo + rnd._randbelow(width)


@dataclass(frozen=True)
class Bools(Draw):
    def strategy(self):
        return st.booleans()

    def sample(self, rnd):
        return rnd.random() < 0.5


@dataclass(frozen=True)
class Sampled(Draw):
    values: tuple

    def strategy(self):
        return st.sampled_from(list(self.values))

    def sample(self, rnd):
        v = self.values  # ``rnd.choice(v)``, the same draw (CPython: v[_randbelow(len(v))])
        if not v:
            return rnd.choice(v)  # (raises as choice does)
        return v[rnd._randbelow(len(v))]


@dataclass(frozen=True)
class Lists(Draw):
    elem: Draw
    min_size: int = 0
    max_size: int = 8

    def strategy(self):
        return st.lists(self.elem.strategy(), min_size=self.min_size, max_size=self.max_size)

    def sample(self, rnd):
        rb = rnd._randbelow  # randint(lo, hi) == lo + _randbelow(hi - lo + 1): same stream
        if self.max_size < self.min_size:
            return rnd.randint(self.min_size, self.max_size)  # (raises as before)
        n = self.min_size + rb(self.max_size - self.min_size + 1)
        e = self.elem
        if type(e) is Ints and e.hi >= e.lo:  # token lists: the element draw inlined, and
            # _randbelow's own loop with it (getrandbits of the width's bit length until one
            # is below the width: CPython's _randbelow_with_getrandbits, the same stream)
            lo, width = e.lo, e.hi - e.lo + 1
            bits, draw = width.bit_length(), rnd.getrandbits
            out = []
            for _ in range(n):
                r = draw(bits)
                while r >= width:
                    r = draw(bits)
                out.append(lo + r)
            return out
        return [e.sample(rnd) for _ in range(n)]


@dataclass(frozen=True)
class Tuples(Draw):
    elems: tuple

    def strategy(self):
        return st.tuples(*(e.strategy() for e in self.elems))

    def sample(self, rnd):
        return tuple(e.sample(rnd) for e in self.elems)


@dataclass(frozen=True)
class Mapped(Draw):
    draw: Draw
    fn: Callable

    def strategy(self):
        return self.draw.strategy().map(self.fn)

    def sample(self, rnd):
        return self.fn(self.draw.sample(rnd))


def tokens(vocab: int, min_size: int, max_size: int) -> Lists:
    """Token lists over ``range(vocab)``."""
    return Lists(Ints(0, vocab - 1), min_size, max_size)


PICK = Ints(0, 7)  # an index into a list of candidates (taken modulo its length)

# -- arguments: draws turned into an op argument against the driver's state --------------------

def _small(small, params) -> tuple:
    if small is None:
        return ()
    return tuple(small(params)) if callable(small) else tuple(small)


class Arg:
    """How one op argument is produced (see the module docstring)."""

    draws: Mapping[str, Draw] = {}
    small = None

    def ready(self, d) -> bool:
        return True

    def value(self, d, raw: Mapping):
        raise NotImplementedError

    def values(self, params) -> tuple:
        return _small(self.small, params)


@dataclass(frozen=True)
class Drawn(Arg):
    draw: Draw
    small: object = None
    name: str | None = None  # the draw's name; default: the argument's (set by ``Gen``)

    @property
    def draws(self):
        return {self.name: self.draw}

    def value(self, d, raw):
        return raw[self.name]


@dataclass(frozen=True)
class Const(Arg):
    v: object
    small: object = None

    def value(self, d, raw):
        return self.v

    def values(self, params) -> tuple:
        return _small(self.small, params) or (self.v,)


@dataclass(frozen=True)
class Fresh(Arg):
    small: object = (1, 2)

    def value(self, d, raw):
        return d.new_id()


@dataclass(frozen=True)
class Among(Arg):
    candidates: Callable  # driver -> sorted list of ids
    small: object = (1, 2)
    newest: bool = False  # pick 0 = the last candidate (else the first)

    @property
    def draws(self):
        return {"pick": PICK}

    def ready(self, d) -> bool:
        return bool(self.candidates(d))

    def value(self, d, raw):
        c = self.candidates(d)
        if not c and getattr(d, "tolerating", False):
            # the example broke as an earlier failure did (``KVMachine.tolerating``): every op
            # from here is a no-op, and a scenario's later step may find nothing to pick
            return None
        i = raw["pick"] % len(c)
        return c[-1 - i] if self.newest else c[i]


def Live(**kw) -> Among:
    """A live request id (pick 0 = the oldest)."""
    return Among(lambda d: d.live(), **kw)


def Held(**kw) -> Among:
    """A held bare-lock id."""
    return Among(lambda d: sorted(d.subject.locks), **{"small": (1,), **kw})


def remember(d, toks) -> None:
    """Note a sequence for later sharing (``Shared``)."""
    if toks and toks not in d.seen:
        d.seen.append(list(toks))


@dataclass(frozen=True)
class Seq(Arg):
    draw: Draw
    small: object = None
    remember: bool = False
    name: str = "tokens"

    @property
    def draws(self):
        return {self.name: self.draw}

    def value(self, d, raw):
        toks = raw[self.name]
        if self.remember:
            remember(d, toks)
        return toks


@dataclass(frozen=True)
class Shared(Arg):
    """A sequence seen before minus its last ``cut`` tokens plus ``extra`` (both shrink
    towards 0: towards re-using a whole earlier sequence).  ``clip``: keep at most that many
    tokens; ``empty``: what to use if the result is empty; ``needs_seen``: precondition
    (else an empty base while nothing was seen)."""

    cut: Draw
    extra: Draw | None = None  # None: nothing appended (and no draw)
    small: object = None
    remember: bool = False
    clip: int | None = None
    empty: list | None = None
    needs_seen: bool = True

    @property
    def draws(self):
        out = {"pick": PICK, "cut": self.cut}
        return out if self.extra is None else {**out, "extra": self.extra}

    def ready(self, d) -> bool:
        return bool(d.seen) or not self.needs_seen

    def value(self, d, raw):
        base = d.seen[raw["pick"] % len(d.seen)] if d.seen else []
        toks = base[: max(0, len(base) - raw["cut"])] + raw.get("extra", [])
        if self.clip is not None:
            toks = toks[: self.clip]
        if not toks and self.empty is not None:
            toks = list(self.empty)
        if self.remember:
            remember(d, toks)
        return toks


# -- generators ----------------------------------------------------------------------------------


def _always(_):
    return True


@dataclass
class Gen:
    """One generator of an op: its arguments (name -> ``Arg``) and steering."""

    name: str | None = None  # the rule's name; default: the op's
    when: Callable = _always  # driver -> bool, on top of the arguments' own preconditions
    regime: Callable = _always  # params -> bool: the generator exists in this regime
    shape: Callable | None = None  # args -> args (arguments that depend on each other)
    after: Callable | None = None  # (driver, args, result) -> None
    rule: bool = True  # False: alphabet and walks only (a Scenario emits it in the machine)
    args: dict = field(default_factory=dict)
    op: str | None = None  # set by the OpSpec that holds it

    def __init__(self, name=None, *, when=_always, regime=_always, shape=None, after=None,
                 rule=True, **args: Arg):
        self.name, self.when, self.regime, self.shape = name, when, regime, shape
        self.after, self.rule, self.op = after, rule, None
        self.args = {a: (replace(arg, name=a) if isinstance(arg, Drawn) and arg.name is None
                         else arg) for a, arg in args.items()}

    def bind(self, op: str, params: Mapping) -> Gen:
        if set(self.args) != set(params):
            raise ValueError(f"generator of op {op!r} gives {sorted(self.args)}, the op takes "
                             f"{sorted(params)}")
        self.op, self.name = op, self.name or op
        return self

    @property
    def draws(self) -> dict:
        """The named draws, in argument order (the rule's keyword arguments)."""
        cached = self.__dict__.get("_draws")
        if cached is not None:
            return cached
        out: dict = {}
        for arg in self.args.values():
            for k, dr in arg.draws.items():
                if k in out:
                    raise ValueError(f"generator {self.name!r}: two draws named {k!r}")
                out[k] = dr
        self.__dict__["_draws"] = out  # the arguments never change once built
        return out

    def ready(self, d) -> bool:
        return (self.regime(d.params) and all(a.ready(d) for a in self.args.values())
                and self.when(d))

    def ready_in_regime(self):
        """``ready`` less its regime test, for a driver whose regime is known to hold (the
        native engine's ``Picker`` drops the other generators once per walk): a predicate
        on the driver, or None when the generator is always ready there.  Only arguments
        that have a precondition (``Among``, ``Shared``...) and a ``when`` are asked."""
        if "_ready_test" not in self.__dict__:  # the arguments never change once built
            self.__dict__["_ready_test"] = _conjoin(
                [a.ready for a in self.args.values() if type(a).ready is not Arg.ready]
                + ([self.when] if self.when is not _always else []))
        return self.__dict__["_ready_test"]

    def run(self, d, raw: Mapping) -> None:
        args = {a: arg.value(d, raw) for a, arg in self.args.items()}
        if self.shape is not None:
            args = self.shape(args)
        result = d.do(self.op, **args)
        if self.after is not None:
            self.after(d, args, result)

    def ops(self, params) -> list:
        """The finite interpretation: every combination of the arguments' small values."""
        if not self.regime(params):
            return []
        names = list(self.args)
        out = []
        for combo in itertools.product(*(self.args[a].values(params) for a in names)):
            args = dict(zip(names, combo))
            out.append(Op(self.op, self.shape(args) if self.shape else args))
        return out


@dataclass
class Scenario:
    """Steering that is not one op: named draws and ``body(driver, **draws)``, which drives
    several ops (each still an op of the table)."""

    name: str
    body: Callable
    draws: dict = field(default_factory=dict)
    when: Callable = _always
    regime: Callable = _always

    def ready(self, d) -> bool:
        return self.regime(d.params) and self.when(d)

    def ready_in_regime(self):
        """``ready`` less its regime test (see ``Gen.ready_in_regime``)."""
        return _conjoin([self.when] if self.when is not _always else [])

    def run(self, d, raw: Mapping) -> None:
        self.body(d, **raw)


def _conjoin(tests: list):
    """One predicate for ``all(t(d) for t in tests)``, evaluated in order (None: no tests)."""
    if not tests:
        return None
    if len(tests) == 1:
        return tests[0]
    if len(tests) == 2:
        a, b = tests
        return lambda d: a(d) and b(d)
    return lambda d: all(t(d) for t in tests)


def rule_generators(table) -> list:
    """Every generator that is a rule of the machine (``Gen(rule=True)`` and scenarios)."""
    cached = table.__dict__.get("_rule_generators")
    if cached is None:  # a table never changes once built: bind its generators once
        gens = [g for spec in table.specs.values() for g in spec.gens if g.rule]
        cached = table.__dict__["_rule_generators"] = gens + list(table.scenarios)
    return list(cached)


# -- interpretation 1: Hypothesis rules ----------------------------------------------------------


def _as_rule(gen):
    def body(self, **raw):
        if getattr(self, "tolerating", False):
            return  # the rest of a tolerated example is a no-op (``KVMachine.do``)
        gen.run(self, raw)

    body.__name__ = body.__qualname__ = gen.name
    body.__doc__ = gen.body.__doc__ if isinstance(gen, Scenario) else f"op {gen.op!r}"
    r = rule(**{k: dr.strategy() for k, dr in gen.draws.items()})(body)
    return precondition(gen.ready)(r)


def install_rules(cls, table) -> None:
    """Give the machine class ``cls`` one Hypothesis rule per generator of ``table``."""
    names = set()
    for gen in rule_generators(table):
        if gen.name in names:
            raise ValueError(f"two generators named {gen.name!r}")
        names.add(gen.name)
        setattr(cls, gen.name, _as_rule(gen))


# -- interpretation 3: a plain random.Random ----------------------------------------------------


class Picker:
    """What ``random_step`` picks among, worked out once per walk: the generators of this
    regime with a positive weight, their cumulative weights, their draws."""

    def __init__(self, gens, params, weights=None):
        self.pool = [g for g in gens if g.regime(params)
                     and (weights is None or weights.get(g.name, 0) > 0)]
        self.weights = weights
        self.cum = None
        if weights is not None:
            self.cum = list(itertools.accumulate(weights[g.name] for g in self.pool))
        self.draws = [list(g.draws.items()) for g in self.pool]
        # each pooled generator's precondition less the regime (which holds for all of them)
        self.tests = [g.ready_in_regime() for g in self.pool]

    def ready(self, i: int, d) -> bool:
        """Whether generator ``i`` of the pool may run now (``pool[i].ready(d)``)."""
        t = self.tests[i]
        return t is None or t(d)

    def pick(self, d, rnd: random.Random):
        """A ready generator and its index, or None.  A few picks are tried before every
        precondition is evaluated (most generators are ready most of the time); the pick is
        the same distribution either way: uniform/weighted over the ready generators."""
        pool, tests, n = self.pool, self.tests, len(self.pool)
        if not n:
            return None
        cum = self.cum
        for _ in range(4):
            if cum is None:
                i = int(rnd.random() * n)
            else:
                i = bisect.bisect_right(cum, rnd.random() * cum[-1])
            t = tests[i]
            if t is None or t(d):
                return i
        ready = [i for i in range(n) if tests[i] is None or tests[i](d)]
        if not ready:
            return None
        if self.weights is None:
            return rnd.choice(ready)
        return rnd.choices(ready, weights=[self.weights[pool[i].name] for i in ready])[0]


def random_step(d, gens, rnd: random.Random, weights=None, picker: Picker | None = None) -> bool:
    """Run one generator picked at random (uniformly, or by ``weights``: name -> weight)
    among those whose preconditions hold, its draws sampled from ``rnd``; False if none can
    run.  ``picker``: the walk's ``Picker`` (built here when not given)."""
    picker = picker or Picker(gens, d.params, weights)
    i = picker.pick(d, rnd)
    if i is None:
        return False
    picker.pool[i].run(d, {k: dr.sample(rnd) for k, dr in picker.draws[i]})
    return True


class Driver:
    """What generators read and act on (``KVMachine`` is one too)."""

    def init_driver(self) -> None:
        self._ids = 0
        self.seen: list[list[int]] = []
        self.notes: dict = {}

    def new_id(self) -> int:
        self._ids += 1
        return self._ids

    def live(self) -> list[int]:
        return self.subject.live()


class Walk(Driver):
    """A seeded random walk over one variant's generators, through a ``Run`` (every invariant
    after every op).  ``walk(...)`` runs one; the native engine (``state_machines/native.py``)
    builds on this.  ``op_counts``: how often each op was applied."""

    def __init__(self, spec, params: dict, *, fault=None, target="reference", device=None,
                 src=None, known_findings="decline"):
        from collections import Counter

        self.spec, self.params = spec, spec.check_params(params, target)
        self.run = Run(spec, self.params, fault, target, device, src=src,
                       known_findings=known_findings)
        self.subject = self.run.subject
        self.op_counts: Counter = Counter()
        self.init_driver()

    def do(self, name: str, **args) -> str:
        self.op_counts[name] += 1
        return self.run.apply(Op(name, args))


def walk(spec, params: dict, seed: int, steps: int, *, fault=None, target="reference",
         device=None, weights=None, quiesce: bool = True) -> Walk:
    """One reproducible random walk of about ``steps`` generator runs (a scenario may apply
    several ops), then ``quiesce``.  A broken property stops it: ``w.run.violation`` and
    ``w.run.trace()`` say what and how."""
    from invariants import Violation

    w = Walk(spec, params, fault=fault, target=target, device=device)
    rnd = random.Random(seed)
    gens = rule_generators(spec.ops)
    try:
        for _ in range(steps):
            if not random_step(w, gens, rnd, weights):
                break
        if quiesce:
            w.run.step(Op("quiesce"))
    except Violation:
        pass
    return w
