"""The lifecycle ops as op-table entries, written once for the radix-tree variants (radix,
himamba, paged-bigpage): ``decode``, ``retract``, ``enqueue``, ``schedule`` (and ``spec_decode`` where the
variant frees rejected drafts), and the ``burst`` rule (several arrivals, one scheduling
step).  The subjects' side is ``caches/subjects/lifecycle.py``."""

from __future__ import annotations

from state_machines.gen import (Among, Drawn, Fresh, Gen, Ints, Lists, Scenario, Shared,
                                Tuples, remember, tokens)
from state_machines.ops import INT, TOKENS, OpSpec

MAX_WAITING = 3


def decoding(d) -> list[int]:
    """Live requests past their prefill (what decode, speculative decode and retract take)."""
    reqs = d.subject.requests
    return [rid for rid in d.live() if reqs[rid].filled >= len(reqs[rid].tokens)]


DECODING = Among(decoding)


def driven(op: str):
    """A generator precondition: the subject's target takes ``op`` (an op its adapter declines,
    ``lifecycle_declined``, is never drawn there -- it would only be a wasted no-op step)."""
    return lambda d: op not in getattr(d.subject, "lifecycle_declined", {})


# What a target's declined lifecycle op (``lifecycle_declined``: decode, spec_decode, retract,
# schedule) takes out of reach, for ``kvcheck coverage``: the ops of the table it stands for,
# and the "sometimes" transitions only lifecycle ops reach, each as its alternatives (any one
# set of ops all driven reaches it; a decode step runs in decode, spec_decode and schedule's
# first step).  A transition not named here is never left out.
DECLINED_OPS = {"schedule": ("enqueue", "schedule")}  # (any other key: that op alone)
LIFECYCLE_TRANSITIONS = {
    "decode-new-page": ({"decode"}, {"schedule"}, {"spec_decode"}),
    "output-inserted": ({"decode"}, {"schedule"}, {"spec_decode"}),
    "spec-draft-rejected": ({"spec_decode"},),
    "retract-evicts": ({"retract"},),
    "retract-readmitted": ({"retract", "schedule"},),
    "batch-admitted": ({"schedule"},),
    "admission-refused": ({"schedule"},),
    "dllm-block-rewritten": ({"dllm_step"},),
}


def declined_ops(declined: dict) -> dict:
    """``{op of the table: why}`` for a subject's ``lifecycle_declined``."""
    return {op: why for key, why in declined.items() for op in DECLINED_OPS.get(key, (key,))}


def unreachable(declined: dict) -> dict:
    """``{transition: the declined ops it needs}`` for the transitions no driven op reaches."""
    out = {}
    for name, ways in LIFECYCLE_TRANSITIONS.items():
        if all(way & set(declined) for way in ways):
            out[name] = sorted(set().union(*(way & set(declined) for way in ways)))
    return out


def waiting_room(d) -> bool:
    return len(d.subject.waiting) < MAX_WAITING and driven("schedule")(d)


def lifecycle(vocab: int, arrivals, *, speculative: bool = False, retract: bool = True,
              max_len: int = 6, batch_rules: bool = True) -> tuple[tuple, Scenario]:
    """(the op specs, the ``burst`` scenario) over a ``vocab``-token vocabulary; ``arrivals``:
    the exhaustive search's arriving sequences (params -> lists); ``retract=False`` for a
    variant whose engine retracts another way (paged-bigpage: LightLLM pauses);
    ``batch_rules=False``: ``enqueue`` and ``schedule`` are no rules of their own (``burst``
    drives them; the exhaustive search and walks still take them), for a variant whose other
    rules should be diluted less (continuation-state: two more rules beside its seven)."""
    specs = [
        OpSpec("decode", {"rid": INT, "n": INT},
               "decode {n} step(s) of r{rid} (a slot each; a fresh page at a page boundary)",
               gen=Gen(rid=DECODING, n=Drawn(Ints(1, 4), small=(1,)), when=driven("decode"))),
        OpSpec("retract", {"rid": INT},
               "retract r{rid} (release without insert, reset, back to the waiting queue)",
               gen=Gen(rid=DECODING, when=driven("retract"))),
        OpSpec("enqueue", {"rid": INT, "tokens": TOKENS, "max_new": INT},
               "r{rid} arrives with {tokens} (max_new_tokens {max_new}) and waits",
               gen=Gen(rid=Fresh(), tokens=Shared(Ints(0, 12), tokens(vocab, 1, max_len),
                                                  small=arrivals, remember=True,
                                                  needs_seen=False),
                       max_new=Drawn(Ints(1, 4), small=(1,)), when=waiting_room,
                       rule=batch_rules)),
        OpSpec("schedule", {"n": INT},
               "schedule: admit up to {n} waiting request(s) against the budget, prefill "
               "them, decode one step",
               gen=Gen(n=Drawn(Ints(1, MAX_WAITING), small=(MAX_WAITING,)),
                       when=lambda d: bool(d.subject.waiting) and driven("schedule")(d),
                       rule=batch_rules)),
    ]
    if not retract:
        specs = [spec for spec in specs if spec.name != "retract"]
    if speculative:
        specs.insert(1, OpSpec(
            "spec_decode", {"rid": INT, "draft": INT, "accepted": INT},
            "speculative step of r{rid}: slots for {draft} draft(s) + 1, accept {accepted}, "
            "free the rejected",
            gen=Gen(rid=DECODING, draft=Drawn(Ints(1, 3), small=(1,)),
                    accepted=Drawn(Ints(0, 3), small=(0,)),
                    shape=lambda a: {**a, "accepted": min(a["accepted"], a["draft"])},
                    when=driven("spec_decode"))))

    def burst(d, arrivals) -> None:
        """Several requests arrive at once and one scheduling step takes them (a batch
        against one budget: what the engines' schedulers form every step)."""
        for toks, max_new in arrivals:
            if not waiting_room(d):
                break
            remember(d, toks)
            d.do("enqueue", rid=d.new_id(), tokens=list(toks), max_new=max_new)
        d.do("schedule", n=MAX_WAITING)

    scenario = Scenario("burst", burst, {"arrivals": Lists(Tuples((
        tokens(vocab, 1, max_len + 2), Ints(1, 2))), min_size=1, max_size=MAX_WAITING)},
        when=waiting_room)
    return tuple(specs), scenario
