"""``--target sglang`` / ``--target sglang-rust`` at himamba ``host=0`` on SGLang 0.5.23:
``UnifiedRadixCache`` with the Full and Mamba components over the real ``HybridReqToTokenPool``
/ ``MambaPool``, on the Python and the Rust tree core.

Run with the default upstream environment (``bash ci/upstream/setup.sh``):
``.venv-upstream/bin/python -m pytest -q tests/upstream/test_sglang_unified_mamba.py``.  Where
sglang is not importable, or another release is installed, the module skips, saying why.
"""

import pytest

from caches.adapters.sglang import loader

REASON = loader.unavailable_reason() or loader.release_reason("0.5.23")
if REASON:
    pytest.skip(REASON, allow_module_level=True)

from caches.adapters.sglang.unified_mamba import make_subject  # noqa: E402
from caches.target import FaultNotInjectable, TargetUnavailable  # noqa: E402
from invariants import Violation  # noqa: E402
from state_machines.diff import format_diff, run_diff  # noqa: E402
from state_machines.fuzz import fuzz  # noqa: E402
from state_machines.himamba import SPEC  # noqa: E402
from state_machines.ops import Op  # noqa: E402
from state_machines.targets import get_target  # noqa: E402
from tests.harness import logged_evict_for_alloc  # noqa: E402

PARAMS = SPEC.check_params(next(r for r in SPEC.regimes if r.get("host") == 0))
HOST1 = SPEC.check_params(SPEC.regimes[0])
CORES = {"sglang": "UnifiedTreeCore", "sglang-rust": "RustUnifiedTreeCore"}


def subject(core="python", **params):
    return make_subject(SPEC.check_params({"host": 0, **params}), core=core)


def apply(s, name, **args):
    return SPEC.ops.apply(s, Op(name, args))


def test_both_cores_build_full_and_mamba_over_the_real_pools():
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool, MambaPool

    sg = loader.load()
    for target, core in CORES.items():
        s = get_target(target).build("himamba", PARAMS)
        assert type(s.cache.tree).__name__ == "UnifiedRadixCache"
        assert type(s.cache.tree.tree_core).__name__ == core
        assert s.cache.tree.tree_components == (sg.ComponentType.FULL, sg.ComponentType.MAMBA)
        assert isinstance(s.cache.req_to_token_pool, HybridReqToTokenPool)
        assert isinstance(s.cache.req_to_token_pool.mamba_pool, MambaPool)
        assert apply(s, "backup", tokens=[0]).startswith("skipped: no host tier")


def test_host_1_storage_1_is_driven():
    """host=1 (storage 0 and 1) is ``unified_hicache.py`` (with ``unified_storage.py`` at
    storage=1; tests/upstream/test_sglang_unified_hicache.py): 0.5.23 refuses no himamba
    regime, not even host pools smaller than the device ones (SGLang PR #28614)."""
    small_host = {**HOST1, "policy": 2, "kv_slots": 6, "host_kv_slots": 3, "mamba_slots": 4,
                  "host_mamba_slots": 2}
    for target in CORES:
        assert get_target(target).params_unavailable("himamba", HOST1) is None
        assert get_target(target).params_unavailable("himamba", small_host) is None
        assert get_target(target).build("himamba", HOST1).cache.storage is not None


def test_the_older_releases_refuse_host_pools_not_larger_than_the_device_ones():
    from caches.adapters.sglang import versions

    small_host = {"host": 1, "kv_slots": 6, "host_kv_slots": 3, "mamba_slots": 4,
                  "host_mamba_slots": 8}
    why = versions.himamba_host_unsupported("0.5.10.post1", small_host)
    assert "host_kv_slots 3 vs kv_slots 6" in why and "#28614" in why
    assert versions.himamba_host_unsupported("0.5.10.post1", {**small_host,
                                                               "host_kv_slots": 7}) is None
    assert versions.himamba_host_unsupported("0.5.23", small_host) is None


def test_the_cli_and_the_nightly_run_every_regime_as_asked():
    from argparse import Namespace

    from state_machines.commands.common import regimes_from_args
    from state_machines.nightly import plan

    args = Namespace(target="sglang-rust", src=None, param=None, page_size=None)
    regimes = regimes_from_args(args, SPEC)
    # SGLang's own (HIMAMBA_REGIMES), ending with its small-pool host=1 ones: storage=0,
    # storage=1, and write_back (policy=2) with host pools smaller than the device ones
    assert [(r["host"], r["storage"], r["policy"]) for r in regimes][-3:] == \
        [(1, 0, 0), (1, 1, 0), (1, 0, 2)]
    from caches.adapters.sglang.target import HIMAMBA_REGIMES

    assert len(regimes) == len(HIMAMBA_REGIMES)
    items, skipped = plan(60, 1, variants=["himamba"], targets=["sglang", "sglang-rust"])
    assert len(items) == 2 * len(regimes) and skipped == []


@pytest.mark.parametrize("core", ["python", "rust"])
def test_request_paths_fork_donate_and_free_states(core):
    """A chunk (``checkpoint``) forks the running state into a fresh slot for the tree;
    finishing (``release_kv_cache``'s steps) donates the request's own slot; an abort frees
    it; the request rows come back."""
    s = subject(core, kv_slots=8, mamba_slots=6)
    c = s.cache
    assert apply(s, "admit", rid=1, tokens=[0, 1, 0]) == "hit 0 of 3 tokens at root, allocated 3"
    free_states = s.mamba.available_size()
    apply(s, "prefill", rid=1, n=2)
    s.check()
    assert s.mamba.available_size() == free_states - 1  # the fork went to the tree
    assert c.full_protected_size_ == 2 and c.mamba_protected_size_ == 1
    apply(s, "prefill", rid=1, n=1)
    apply(s, "finish", rid=1)
    s.check()
    assert c.full_evictable_size_ == 3 and c.full_protected_size_ == 0
    assert c.mamba_evictable_size_ == 2  # [0 1] (the fork) and [0 1 0] (the request's slot)
    assert s.mamba.available_size() == free_states - 1
    apply(s, "admit", rid=2, tokens=[5, 6])
    apply(s, "abort", rid=2)
    assert s.mamba.available_size() == free_states - 1  # the aborted request's state freed
    rows = c.req_to_token_pool
    assert len(rows.free_slots) == rows.size
    s.quiesce()


def test_a_wrong_fork_is_a_data_integrity_violation():
    """The fingerprints live in the real state tensor: a fork that forgets to copy is seen."""
    s = subject()
    apply(s, "admit", rid=1, tokens=[0, 1, 0])
    pool = s.cache.req_to_token_pool.mamba_pool
    pool.copy_from = lambda src, dst: None
    apply(s, "prefill", rid=1, n=2)
    with pytest.raises(Violation) as exc:
        s.check()
    assert exc.value.prop == "data-integrity"


def test_a_lost_unlock_is_caught_white_and_black_box():
    for core, prop in (("python", "ref-balance"), ("rust", "quiescence")):
        s = subject(core)
        s.cache.dec_lock_ref = lambda node: None
        apply(s, "insert", tokens=[1, 2])
        apply(s, "lock", hid=1, tokens=[1, 2])
        apply(s, "unlock", hid=1)
        with pytest.raises(Violation) as exc:
            s.check()
            s.quiesce()
        assert exc.value.prop == prop, (core, exc.value)


def test_a_leaked_state_is_caught_on_the_rust_core():
    """Black box: a mamba slot the pool never gets back breaks conservation."""
    s = subject("rust")
    apply(s, "admit", rid=1, tokens=[3, 4])
    s.mamba.slots.free = lambda idx: None  # nothing the tree or a request frees returns
    apply(s, "abort", rid=1)
    with pytest.raises(Violation) as exc:
        s.check()
    assert exc.value.prop == "conservation"


def test_chunk_hits_follow_0_5_23s_contract():
    """0.5.23 counts a hit once per request and node (``inserted_len``), where 0.5.12 counted
    none for a chunk; a second count of the same node by the same request is caught."""
    s = subject(kv_slots=8, mamba_slots=6)
    apply(s, "admit", rid=1, tokens=[0, 1, 2, 3, 4])
    apply(s, "prefill", rid=1, n=2)
    node = s.requests[1].last_node
    assert node.hit_count == 1
    tree, real = s.cache.tree, s.cache.tree.checkpoint

    def forgetful(req, *, up_to):  # the request forgets what it inserted: counts [0 1] again
        req.kv.cache_inserted_len = 0
        return real(req, up_to=up_to)
    tree.checkpoint = forgetful
    with pytest.raises(Violation) as exc:
        apply(s, "prefill", rid=1, n=2)
    assert exc.value.prop == "hit-count"


@pytest.mark.parametrize("target", sorted(CORES))
def test_fuzz_clean(target):
    out = fuzz(SPEC, PARAMS, target=target, max_examples=40, seed=0)
    assert out.error is None, out.error
    assert not out.failed, out.trace.violation
    assert out.steps > 500


def test_python_and_rust_cores_agree_step_by_step():
    res = run_diff("himamba", "sglang", PARAMS, max_examples=40, seed=0, against="sglang-rust")
    assert res.error is None, res.error
    assert not res.diverged, format_diff(res)
    assert res.steps > 500


def test_the_rust_core_takes_no_fault():
    with pytest.raises(FaultNotInjectable, match="compiled"):
        make_subject(PARAMS, core="rust", fault="R4")


def test_fault_R4_in_the_full_component_caught_on_its_property(tmp_path):
    """R4 patched into 0.5.23's ``FullComponent`` lock walks (the Full + Mamba tree shares it
    with the radix variant), Python core: caught on ref-balance."""
    from tests.harness import assert_caught_on_upstream

    assert_caught_on_upstream(SPEC, PARAMS, "R4", tmp_path, target="sglang")


def test_policy_fault_P6_in_the_mamba_component_caught_on_victim(tmp_path):
    """P6 patched into 0.5.23's ``MambaComponent`` (the walk runs from the list's MRU end),
    Python core: caught on ``victim`` by the Mamba walk's declared key, shrunk, replayed."""
    from tests.harness import assert_caught_on_upstream

    assert_caught_on_upstream(SPEC, PARAMS, "P6", tmp_path, target="sglang")


@pytest.mark.parametrize("fid", ["R1", "R3", "H1", "H2", "H3", "H4", "H5", "P7"])
def test_faults_without_a_0_5_23_form_say_why(fid):
    with pytest.raises(FaultNotInjectable, match="no upstream form"):
        make_subject(PARAMS, core="python", fault=fid)


# -- eviction policy (invariants/policy.py): 0.5.23's own victims, 0.5.23's own keys -----------
def _victims_recorded(monkeypatch):
    """Patch the subject's policy check to log, per pass kind, (pass size, victims seen, what
    upstream reported evicting) -- the sizes from the views, the report from the cache call."""
    from caches.adapters.sglang import unified_mamba as um
    from caches.subjects.himamba import HiMambaSubject

    log, reported = {}, []
    for name, attr in (("evict", "num_tokens_evicted"), ("evict_mamba", "mamba_num_evicted")):
        def call(self, n, *rest, _name=name, _attr=attr):
            r = self.tree.evict(self.sg.EvictParams(num_tokens=n if _name == "evict" else 0,
                                                    mamba_num=n if _name != "evict" else 0))
            reported.append((_name, n, int(getattr(r, _attr))))
            return getattr(r, _attr)
        monkeypatch.setattr(um.UnifiedMambaCache, name, call)
    # a KV allocation's eviction: evict_from_tree_cache -> evict_for_alloc(shortfall), a Full
    # pass of its own (the Mamba component's internal evict_for_alloc(0, 1) calls are not)
    cls = loader.load().UnifiedRadixCache
    evict_for_alloc = cls.evict_for_alloc

    def logged(self, params, **kwargs):
        r = evict_for_alloc(self, params, **kwargs)
        if params.num_tokens > 0:
            reported.append(("evict", params.num_tokens, int(r.num_tokens_evicted)))
            log["alloc passes"] = log.get("alloc passes", 0) + 1
        return r
    monkeypatch.setattr(cls, "evict_for_alloc", logged)
    check = HiMambaSubject.check_policy

    def recording(self):
        mine = [r for r in reported if r[1] > 0]
        reported.clear()
        evs = [ev for ev in self._policy_events if ev[0] in ("evict", "evict_mamba")]
        assert [(ev[0], ev[1]) for ev in evs] == [r[:2] for r in mine]
        for ev, (_, _, got) in zip(evs, mine):
            chosen = [v for v in ev[3] if not isinstance(v, tuple)]
            seen = len(chosen) if ev[0] == "evict_mamba" else \
                sum(len(ev[2].nodes[v].value) for v in chosen)
            assert seen == got, (ev[0], ev[1], chosen, got)  # every victim of the pass seen
            log.setdefault(ev[0], 0)
            log[ev[0]] += len(chosen)
        return check(self)

    monkeypatch.setattr(HiMambaSubject, "check_policy", recording)
    return log


def test_policy_checks_see_every_victim_of_both_walks_and_a_wrong_key_fails(monkeypatch):
    """Python core: every pass of the Full walk and of the Mamba walk has its victims recorded
    (as many tokens / states as upstream reports evicting), a clean run passes every policy
    check, and a declared Full key that disagrees with upstream's (MRU) fails on ``victim``."""
    from caches.adapters.sglang.unified_mamba import UnifiedMambaSubject

    log = _victims_recorded(monkeypatch)
    out = fuzz(SPEC, PARAMS, target="sglang", max_examples=60, seed=0)
    assert out.error is None and not out.failed, out.trace and out.trace.violation
    assert log.get("evict", 0) > 20 and log.get("evict_mamba", 0) > 5, log
    assert log.get("alloc passes", 0) > 5, log  # allocations evicted through evict_for_alloc
    monkeypatch.setattr(UnifiedMambaSubject, "victim_key",
                        staticmethod(lambda n: (-n.extra["time"],)))  # MRU: not upstream's
    out = fuzz(SPEC, PARAMS, target="sglang", max_examples=60, seed=0)
    assert out.failed and out.prop == "victim", out.trace and out.trace.violation


def test_the_rust_core_declares_no_policy():
    s = subject("rust")
    assert s.policy_internals() is None
    apply(s, "insert", tokens=[1])
    apply(s, "evict", n=1)
    assert s._policy_events == []


def _branches():
    """[1] (state), [2] (state), [1 3] (state) below [1], then a match of [1 3]: node times
    put [2] oldest, but the Mamba list has [1] at its LRU end -- the match refreshed only its
    end node's state (``MambaComponent.refresh_lru``), the whole path's times."""
    s = subject()
    for tokens in ([1], [2], [1, 3]):
        apply(s, "insert", tokens=tokens)
        s.check()
    apply(s, "match", tokens=[1, 3])
    s.check()
    return s


def test_the_mamba_walk_goes_by_its_lru_list_not_by_node_times():
    """The declared Mamba key is the list order, and it is the one upstream uses: the walk
    tombstones [1] (list LRU end) though [2] has the older time; a declared node-time key
    (0.5.12's, ``lru_key``) fails on ``victim`` for exactly that pass."""
    from invariants.policy import lru_key

    s = _branches()
    by_key = {n.key: n for n in s._walk() if n.key}
    assert by_key[(2,)].last_access_time < by_key[(1,)].last_access_time
    assert apply(s, "evict_mamba", n=1) == "evicted 1 mamba states"
    ev = next(e for e in s._policy_events if e[0] == "evict_mamba")
    assert ev[3] == [by_key[(1,)].id] and by_key[(1,)].mamba_value is None  # a tombstone
    s.check()  # the declared key: clean

    s = _branches()
    s.state_victim_key = staticmethod(lru_key)
    apply(s, "evict_mamba", n=1)
    with pytest.raises(Violation) as exc:
        s.check()
    assert exc.value.prop == "victim" and "evict_mamba(1)" in str(exc.value)


def _mru_walk(lru, ct):
    """Fault P6's shape on 0.5.23 (this instance only): the Mamba walk starts at the list's
    MRU end and moves toward its LRU end (``get_lru_no_lock`` / ``get_prev_no_lock`` turned
    round)."""
    pt = lru._pt

    def unlocked(x):
        while x is not lru.tail and x.component_data[ct].lock_ref > 0:
            x = x.lru_next[pt]
        return None if x is lru.tail else x

    lru.get_lru_no_lock = lambda: unlocked(lru.head.lru_next[pt])
    lru.get_prev_no_lock = lambda node, check_id=True: unlocked(node.lru_next[pt])


@pytest.mark.parametrize("walk", ["full", "mamba"])
def test_a_patched_upstream_taking_the_mru_victim_is_caught_on_victim(walk):
    """Upstream patched to evict the most recently used first -- the Full heap on SGLang's own
    ``MRUStrategy`` (``--radix-eviction-policy mru``), or the Mamba walk turned round (P6's
    shape) -- is reported on ``victim`` the step it happens; unpatched, the same ops pass."""
    from sglang.srt.mem_cache.evict_policy import MRUStrategy

    op = {"full": ("evict", 1), "mamba": ("evict_mamba", 1)}[walk]
    for patched in (False, True):
        s = subject()
        core = s.cache.tree.tree_core
        if patched and walk == "full":
            core.eviction_strategy = MRUStrategy()  # bound at the Full walk's first start
        elif patched:
            _mru_walk(core.lru_lists[s.cache.MAMBA], s.cache.MAMBA)
        for tokens in ([1], [2]):
            apply(s, "insert", tokens=tokens)
            s.check()
        apply(s, op[0], n=op[1])
        if not patched:
            s.check()
            assert [n.key for n in s._walk() if n.key] == [(2,)]  # [1], the older, went
            continue
        with pytest.raises(Violation) as exc:
            s.check()
        assert exc.value.prop == "victim", exc.value


def test_a_kv_allocation_evicts_only_the_shortfall_through_evict_for_alloc():
    """0.5.23's ``alloc_token_slots``: ``evict_from_tree_cache(tree, n)`` asks
    ``evict_for_alloc`` for the shortfall ``n - free`` only; that pass's victims are seen and
    the allocation passes its policy check."""
    s = subject("python", kv_slots=6, mamba_slots=6)
    for rid, tokens in ((1, [1, 1]), (2, [2, 2]), (3, [3, 3])):
        apply(s, "admit", rid=rid, tokens=tokens)
        apply(s, "prefill", rid=rid, n=2)
        apply(s, "finish", rid=rid)
        s.check()
    assert s.kv.available_size() == 0 and s.cache.full_evictable_size_ == 6
    asked = logged_evict_for_alloc(s.cache.tree)
    apply(s, "admit", rid=4, tokens=[4, 4, 4])
    assert asked and asked[0][0] == 3 and asked[0][1] in (3, 4), asked  # 3 short: 2 leaves
    alloc = [ev for ev in s._policy_events if ev[0] == "alloc"]
    assert [ev[1] for ev in alloc] == [3] and len(alloc[0][4]) == 2, alloc
    s.check()


def test_a_kv_allocation_evicting_the_whole_request_is_over_eviction(monkeypatch):
    """The 0.5.12 rule (evict all of ``n`` once the allocator is short of it) on 0.5.23 is
    caught on ``over-eviction`` against the declared shortfall."""
    from caches.adapters.sglang.unified_mamba import UnifiedMambaCache

    def whole_request(self, n):
        if self.allocator.available_size() < n:
            self.evict(n)
    monkeypatch.setattr(UnifiedMambaCache, "evict_for_kv_alloc", whole_request)
    s = subject("python", kv_slots=6, mamba_slots=6)
    for rid, tokens in ((1, [1, 1]), (2, [2, 2]), (3, [3])):
        apply(s, "admit", rid=rid, tokens=tokens)
        apply(s, "prefill", rid=rid, n=len(tokens))
        apply(s, "finish", rid=rid)
        s.check()
    assert s.kv.available_size() == 1
    apply(s, "admit", rid=4, tokens=[4, 4, 4])  # 2 short: one leaf; 0.5.12's rule evicts 3
    with pytest.raises(Violation) as exc:
        s.check()
    assert exc.value.prop == "over-eviction", exc.value


# -- the lifecycle past the prefill (decode, retract, schedule), as 0.5.23's scheduler runs it --

def _engine_row(s, rid: int) -> list[int]:
    """The request's ``req_to_token`` row as SGLang holds it (its allocated length)."""
    e = s.cache._reqs[rid]
    return s.cache._row(e, e.kv.kv_allocated_len)


@pytest.mark.parametrize("core", ["python", "rust"])
def test_decode_grows_the_engine_row_and_finish_caches_prompt_and_output(core):
    """A chunk gives the request its SGLang row; each decode step's slot joins that row
    (``alloc_for_decode``) and the state advances in the request's own slot; ``finish``
    (``release_kv_cache(checkpoint=True)``) caches prompt + output and donates that slot."""
    from caches.subjects.himamba import mamba_fp

    s = subject(core, kv_slots=8, mamba_slots=6)
    c = s.cache
    apply(s, "admit", rid=1, tokens=[0, 1, 0])
    apply(s, "prefill", rid=1, n=2)  # a chunk: the engine holds the row from here on
    apply(s, "prefill", rid=1, n=1)
    assert apply(s, "decode", rid=1, n=2).startswith("decoded 2: 5 tokens computed")
    req = s.requests[1]
    assert _engine_row(s, 1) == req.kv_indices and len(req.kv_indices) == 5
    assert s.mamba.read([req.mamba_slot]) == [mamba_fp(req.tokens)]
    s.check()
    apply(s, "finish", rid=1)
    s.check()
    assert c.full_evictable_size_ == 5 and c.full_protected_size_ == 0
    assert c.mamba_evictable_size_ == 2  # the chunk's fork and the finished request's slot
    assert s.match(req.tokens).startswith("hit 5")
    s.quiesce()


def test_a_decode_row_left_stale_in_the_engine_breaks_conservation(monkeypatch):
    """Without copying the grown row back (the ``_sync_row`` hook), the engine frees the
    prompt's row only and the decode slots leak: the 5-step trace fuzzing found (its empty
    first chunk, a shrinker artefact no scheduler issues, is a one-token chunk here)."""
    from caches.adapters.sglang.unified_mamba import UnifiedMambaCache

    monkeypatch.setattr(UnifiedMambaCache, "sync_row", None)
    s = subject("python")
    apply(s, "admit", rid=1, tokens=[0, 1])
    apply(s, "prefill", rid=1, n=1)
    apply(s, "prefill", rid=1, n=1)
    apply(s, "decode", rid=1, n=2)
    with pytest.raises(Violation) as exc:
        apply(s, "retract", rid=1)
        s.check()
    assert exc.value.prop == "conservation", exc.value


@pytest.mark.parametrize("core", ["python", "rust"])
def test_retract_releases_without_insert_and_schedule_readmits_through_the_match(core):
    """``retract_decode`` -> ``release_req``: ``release_kv_cache(checkpoint=False)`` frees the
    KV past the chunk's prefix, the request's state and its row, and ``reset_for_retract``
    drops its state slot; the same request (prompt + output) waits, and ``schedule`` matches
    it again: the chunk's prefix is a hit, its state a copy-on-write of the node's."""
    s = subject(core, kv_slots=10, mamba_slots=6)
    c = s.cache
    apply(s, "admit", rid=1, tokens=[0, 1, 0])
    apply(s, "prefill", rid=1, n=2)
    apply(s, "prefill", rid=1, n=1)
    apply(s, "decode", rid=1, n=2)
    free_kv, free_states = s.kv.available_size(), s.mamba.available_size()
    rows = c.req_to_token_pool
    assert apply(s, "retract", rid=1).startswith("retracted with 5 tokens (2 output)")
    s.check()
    assert s.kv.available_size() == free_kv + 3  # the KV past the 2-token prefix
    assert s.mamba.available_size() == free_states + 1  # its own state, not inserted
    assert c.full_evictable_size_ == 2 and len(rows.free_slots) == rows.size
    waiting = s.waiting[1]
    assert waiting.mamba_slot is None and len(waiting.tokens) == 5 and waiting.output == 2
    out = apply(s, "schedule", n=1)
    assert out.startswith("admitted r1"), out
    s.check()
    req = s.requests[1]
    assert req.retracted == 1 and req.cache_protected_len == 2 and len(req.tokens) == 6
    apply(s, "finish", rid=1)
    s.check()
    assert c.full_evictable_size_ == 6
    s.quiesce()


def test_schedule_admits_a_batch_and_refuses_past_the_running_cap():
    """One scheduling step admits waiting requests in order against the budget (the
    ``PrefillAdder`` rule; with the separate ``MambaPool`` 0.5.23 adds no mamba-slot term) and
    stops at ``max_running_requests``."""
    s = subject("python", kv_slots=12, mamba_slots=6)
    for rid, tokens in ((1, [0, 1]), (2, [1, 1]), (3, [2, 2])):
        apply(s, "enqueue", rid=rid, tokens=tokens, max_new=2)
    out = apply(s, "schedule", n=3)
    assert out.startswith("admitted r1, r2 of 3 waiting"), out
    assert sorted(s.requests) == [1, 2] and list(s.waiting) == [3]
    s.check()
    for rid in (1, 2):
        apply(s, "finish", rid=rid)
    assert apply(s, "schedule", n=3).startswith("admitted r3")
    s.check()
    s.quiesce()
