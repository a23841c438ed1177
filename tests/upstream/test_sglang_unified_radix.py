"""``--target sglang`` / ``--target sglang-rust`` on SGLang 0.5.23: ``UnifiedRadixCache`` (Full
component) over the Python and the Rust tree core, under the radix machine.

Run with the default upstream environment (``bash ci/upstream/setup.sh``):
``.venv-upstream/bin/python -m pytest -q tests/upstream/test_sglang_unified_radix.py``.  Where
sglang is not importable, or another release is installed, the module skips, saying why.
"""

import dataclasses
from pathlib import Path

import pytest

from caches.adapters.sglang import loader

REASON = loader.unavailable_reason() or loader.release_reason("0.5.23")
if REASON:
    pytest.skip(REASON, allow_module_level=True)

from caches.adapters.sglang.unified_radix import make_subject  # noqa: E402
from invariants import Violation  # noqa: E402
from state_machines.diff import run_diff  # noqa: E402
from state_machines.fuzz import fuzz  # noqa: E402
from state_machines.ops import Op  # noqa: E402
from state_machines.radix import SPEC  # noqa: E402
from state_machines.targets import get_target  # noqa: E402
from tests.harness import logged_evict_for_alloc  # noqa: E402

REGIMES = [SPEC.check_params(r) for r in SPEC.regimes]
IDS = [f"ps{r['page_size']}" for r in REGIMES]
CORES = {"sglang": "UnifiedTreeCore", "sglang-rust": "RustUnifiedTreeCore"}


def test_release_and_both_tree_cores_load():
    assert loader.load().version == "0.5.23"
    for target, core in CORES.items():
        s = get_target(target).build("radix", REGIMES[0])
        assert type(s.cache.tree).__name__ == "UnifiedRadixCache"
        assert type(s.cache.tree.tree_core).__name__ == core


def test_variants_of_older_releases_say_which_env():
    # every variant and every himamba regime runs on 0.5.23 now
    assert get_target("sglang").variant_unavailable("himamba", None) is None
    assert get_target("sglang").params_unavailable("himamba", {"host": 1}) is None
    assert get_target("sglang-rust").variant_unavailable("radix", None) is None


@pytest.mark.parametrize("target", sorted(CORES))
@pytest.mark.parametrize("params", REGIMES, ids=IDS)
def test_fuzz_clean(target, params):
    out = fuzz(SPEC, params, target=target, max_examples=40, seed=0)
    assert out.error is None, out.error
    assert not out.failed, out.trace.violation
    assert out.steps > 500


@pytest.mark.parametrize("params", REGIMES, ids=IDS)
def test_python_and_rust_cores_agree_step_by_step(params):
    res = run_diff("radix", "sglang", params, max_examples=40, seed=0, against="sglang-rust")
    assert res.error is None, res.error
    assert not res.diverged, res.trace.violation
    assert res.steps > 500


@pytest.mark.parametrize("core", ["python", "rust"])
def test_request_paths_use_checkpoint_and_release(core):
    """Chunked prefill (``checkpoint``) moves the request's lock down; finishing
    (``release_kv_cache``'s steps) frees the request-pool row and the partial-page tail."""
    s = make_subject({"page_size": 4, "pool_pages": 6}, core=core)
    apply = lambda name, **args: SPEC.ops.apply(s, Op(name, args))  # noqa: E731
    assert apply("admit", rid=1, tokens=list(range(10))) == "hit 0 of 10 tokens, allocated 10"
    apply("prefill", rid=1, n=5)
    s.check()
    assert s.requests[1].cache_protected_len == 4 and s.cache.protected_size_ == 4
    rtp = s.cache.req_to_token_pool
    assert len(rtp.free_slots) == rtp.size - 1
    apply("prefill", rid=1, n=5)
    apply("finish", rid=1)
    s.check()
    assert len(rtp.free_slots) == rtp.size
    assert s.cache.evictable_size_ == 8 and len(s.pool.free_pages) == 4  # tail page freed
    s.quiesce()


@pytest.mark.parametrize("core", ["python", "rust"])
def test_radix_F1_is_refused_on_0_5_23(core):
    """0.5.12.post1 accepts an unmatched unlock (finding sglang-radix-F1); 0.5.23 refuses it
    in both cores (an assertion; the Rust core panics and poisons itself)."""
    s = make_subject(REGIMES[0], core=core, skip_known_findings=False)
    s.insert([0])
    assert s.stray_unlock([0]).startswith("rejected (")
    if core == "python":
        s.check()



# -- dLLM: a rewritten trailing block (sgl-project/sglang issue #35270; finding F2) --------------
DLLM = [Op("admit", {"rid": 1, "tokens": [0, 0]}), Op("prefill", {"rid": 1, "n": 64}),
        Op("dllm_step", {"rid": 1, "resolve": 0}), Op("dllm_step", {"rid": 1, "resolve": 0})]
DLLM_PARAMS = {"page_size": 4, "pool_pages": 6}
REPRO = Path(__file__).resolve().parents[1] / "upstream_findings" / "sglang_radix_f2_repro.py"


def _dllm(s, ops=DLLM):
    """Apply ``ops``, checking after each; the results."""
    out = []
    for op in ops:
        out.append(SPEC.ops.apply(s, op))
        s.check()
    return out


@pytest.mark.parametrize("core", ["python", "rust", "radixcache"])
def test_dllm_block_follows_0_5_23s_scheduler_and_stays_clean(core):
    """Declined (the default): the scheduler's own sequence -- the unresolved block is not
    checkpointed (``finish_dllm_forward`` returns first), its slots are reused in place, and
    the resolved block is checkpointed whole.  Then finish hands it to the tree."""
    s = make_subject(DLLM_PARAMS, core=core)
    out = _dllm(s)
    assert out[2] == "new block: positions 0..3 are [0, 0, 1, 2]; the tree owns 0"
    assert out[3] == "block rewritten: positions 0..3 are [0, 0, 2, 0]; the tree owns 0"
    assert s.cache.evictable_size_ + s.cache.protected_size_ == 0
    done = _dllm(s, [Op("dllm_step", {"rid": 1, "resolve": 1}), Op("finish", {"rid": 1})])
    assert done[0].endswith("the tree owns 4") and s.cache.evictable_size_ == 4
    s.quiesce()


@pytest.mark.parametrize("core", ["python", "rust", "radixcache"])
def test_dllm_F2_checkpointing_the_in_flight_block_double_owns_its_pages(core):
    """F2 driven: checkpointing after every step (SGLang issue #35270's sequence) leaves two
    nodes over the block's slots on both tree cores and on the plain RadixCache.  FAILS when a
    release's tree keys only the final ids (sgl-project/sglang PR #35470 / #35781)."""
    s = make_subject(DLLM_PARAMS, core=core, skip_known_findings=False)
    _dllm(s, DLLM[:3])
    SPEC.ops.apply(s, DLLM[3])
    with pytest.raises(Violation) as exc:
        s.check()
    assert exc.value.prop == "conservation"
    assert exc.value.details["ids"] == s.requests[1].kv_indices and \
        "held at two positions by the tree" in exc.value.message
    fixed = make_subject(DLLM_PARAMS, core=core, skip_known_findings=False)
    fixed.apply_fix_model("F2")  # the fix alone: the checkpoint keys only the final ids
    _dllm(fixed)


@pytest.mark.parametrize("flag", [[], ["--rust"]], ids=["python", "rust"])
def test_dllm_F2_stand_alone_script_reproduces(flag):
    import subprocess
    import sys

    run = subprocess.run([sys.executable, str(REPRO), *flag], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "BROKEN at step 2: KV slot(s) [4, 5, 6, 7] are owned by two tree nodes" in run.stdout


def test_dllm_step_is_driven_on_0_5_23_and_declined_by_the_older_adapter():
    from caches.adapters.sglang.radix import SglangRadixSubject

    s = make_subject(DLLM_PARAMS, core="python")
    assert "dllm_step" not in s.lifecycle_declined
    assert "FDFO" in SglangRadixSubject.lifecycle_declined["dllm_step"]


def test_a_lost_unlock_is_caught():
    """The checks can fail: an adapter whose unlock never reaches the tree leaves locks
    behind, which the white-box check (Python core) reports as a ref imbalance."""
    s = make_subject(REGIMES[0], core="python")
    s.cache.dec_lock_ref = lambda node: None
    s.insert([1, 2])
    SPEC.ops.apply(s, Op("lock", {"hid": 1, "tokens": [1, 2]}))
    SPEC.ops.apply(s, Op("unlock", {"hid": 1}))
    with pytest.raises(Violation) as exc:
        s.check()
    assert exc.value.prop == "ref-balance"


# -- the plain RadixCache 0.5.23 still ships (target sglang-radixcache) ----------------------------
@pytest.mark.parametrize("params", REGIMES, ids=IDS)
def test_plain_radixcache_fuzz_clean_and_agrees_with_the_unified_cache(params):
    out = fuzz(SPEC, params, target="sglang-radixcache", max_examples=40, seed=0)
    assert out.error is None, out.error
    assert not out.failed, out.trace.violation
    res = run_diff("radix", "sglang-radixcache", params, max_examples=40, seed=0,
                   against="sglang")
    assert res.error is None, res.error
    assert not res.diverged, res.trace.violation


def test_radix_F1_still_in_the_plain_radixcache():
    """0.5.23's ``RadixCache.dec_lock_ref`` is still unguarded (hardening: no scheduler path
    issues an unmatched unlock).  FAILS when a release adds the guard."""
    s = make_subject(REGIMES[0], core="radixcache", skip_known_findings=False)
    s.insert([0])
    assert s.stray_unlock([0]) == "accepted"
    with pytest.raises(Violation) as exc:
        s.check()
    assert exc.value.prop == "ref-balance" and "lock ref is -1" in exc.value.message


def test_a_lost_unlock_is_caught_on_the_rust_core_too():
    """The Rust core's black-box checks can fail: a lock that is never returned leaves
    protected tokens behind after the drain."""
    s = make_subject(REGIMES[0], core="rust")
    s.cache.dec_lock_ref = lambda node: None
    s.insert([1, 2])
    SPEC.ops.apply(s, Op("lock", {"hid": 1, "tokens": [1, 2]}))
    s.check()
    with pytest.raises(Violation) as exc:
        s.quiesce()
    assert exc.value.prop == "quiescence"


@pytest.mark.parametrize("fid", ["R1", "R3", "R4", "R5"])
def test_fault_on_the_plain_radixcache_caught_on_its_property(fid, tmp_path):
    """The 0.5.12.post1 patches (``faults.py``) apply to 0.5.23's ``RadixCache`` text
    unchanged; each is caught on a property FAULTS.md names for it."""
    from caches.faults import get_fault
    from tests.harness import assert_caught_on_upstream

    params = SPEC.check_params({**SPEC.regimes[0], **get_fault(fid).params})
    assert_caught_on_upstream(SPEC, params, fid, tmp_path, target="sglang-radixcache")


def test_fault_R4_in_the_unified_full_component_caught_on_its_property(tmp_path):
    """R4 patched into 0.5.23's ``FullComponent`` lock walks (through SGLang's
    ``component_registry_override``), Python core: caught on its property."""
    from caches.faults import get_fault
    from tests.harness import assert_caught_on_upstream

    params = SPEC.check_params({**SPEC.regimes[0], **get_fault("R4").params})
    assert_caught_on_upstream(SPEC, params, "R4", tmp_path, target="sglang")


@pytest.mark.parametrize("fid", ["R1", "R2", "R3", "R5", "R6", "P2", "P3", "P4"])
def test_faults_without_a_unified_form_say_why(fid):
    with pytest.raises(KeyError, match="no upstream form"):
        make_subject(REGIMES[0], core="python", fault=fid)


def test_the_rust_core_takes_no_fault():
    from caches.target import FaultNotInjectable

    with pytest.raises(FaultNotInjectable):
        make_subject(REGIMES[0], core="rust", fault="R4")


# -- eviction policy (invariants/policy.py): the Full walk's own victims, 0.5.23's own key ------
def _victims_recorded(monkeypatch, subject_cls):
    """Log every eviction pass of the Python core: what upstream reported evicting
    (``EvictResult.num_tokens_evicted``) against the victims the subject recorded at
    ``UnifiedTreeCore.evict_device_leaf`` (their tokens, read from the view before the pass).
    Each pass that evicted anything must have its victims seen, adding up to upstream's count;
    returns the running totals."""
    from caches.adapters.sglang.unified_radix import UnifiedRadixAdapter

    log, reported = {"passes": 0, "victims": 0, "tokens": 0}, []
    evict = UnifiedRadixAdapter.evict

    def reporting(self, n):
        got = evict(self, n)
        if got:
            reported.append((n, int(got)))
        return got

    monkeypatch.setattr(UnifiedRadixAdapter, "evict", reporting)
    check = subject_cls.check_policy

    def recording(self):
        passes = [(ev[1], sum(len(ev[2].nodes[v].value) for v in ev[3]))
                  for ev in self._policy_events if ev[0] == "evict"]
        mine = list(reported)
        reported.clear()
        assert passes == mine  # every pass that evicted: its victims seen, all of them
        for ev in self._policy_events:
            if ev[0] == "evict":
                log["passes"] += 1
                log["victims"] += len(ev[3])
        log["tokens"] += sum(t for _, t in passes)
        return check(self)

    monkeypatch.setattr(subject_cls, "check_policy", recording)
    return log


@pytest.mark.parametrize("params", REGIMES, ids=IDS)
def test_policy_checks_see_every_victim_and_a_wrong_key_fails(monkeypatch, params):
    """Python core: every eviction pass has its victims recorded (as many tokens as upstream
    reports evicting), a clean run passes every policy check (victim, over-eviction,
    spurious-OOM, recency), and a declared key that disagrees with upstream's (MRU) fails on
    ``victim``."""
    from caches.adapters.sglang.unified_radix import UnifiedRadixSubject

    log = _victims_recorded(monkeypatch, UnifiedRadixSubject)
    out = fuzz(SPEC, params, target="sglang", max_examples=60, seed=0)
    assert out.error is None and not out.failed, out.trace and out.trace.violation
    assert log["passes"] > 20 and log["victims"] > 40, log
    if params["page_size"] == 1:  # a victim's parent went in the same pass (on 6 pages of 4
        # the lifecycle ops rarely leave a parent evictable: the directed
        # test_a_victims_parent_competes_at_once covers that regime)
        assert out.reached.get("cascade-eviction", 0) > 0
    monkeypatch.setattr(UnifiedRadixSubject, "policy", dataclasses.replace(  # MRU: not upstream's
        UnifiedRadixSubject.policy, key=lambda n: (-n.extra["time"],)))
    out = fuzz(SPEC, params, target="sglang", max_examples=60, seed=0)
    assert out.failed and out.prop == "victim", out.trace and out.trace.violation


def test_the_rust_core_records_no_victims():
    """The Rust core exposes no nodes: nothing is recorded, no policy check runs there."""
    s = make_subject(REGIMES[0], core="rust")
    s.insert([1])
    SPEC.ops.apply(s, Op("evict", {"n": 1}))
    assert s._policy_events == [] and s.cache.evictable_size_ == 0
    s.check()


def _family(s, ps=1):
    """[1 2], [1 3] (splitting [1] off), then [4] -- each token a page of ``ps``: the leaves
    [2], [3] are older than [4], and so is their parent [1]."""
    for tokens in ([1, 2], [1, 3], [4]):
        s.insert([t for t in tokens for _ in range(ps)])
        s.check()


@pytest.mark.parametrize("params", REGIMES, ids=IDS)
def test_a_victims_parent_competes_at_once(params):
    """Evicting 3 pages takes [2], [3] and then their parent [1] -- pushed back on the heap
    the moment it is a leaf, older than [4] -- as the declared rule (``cascade_exposes=False``
    with the parent pushed back) and the reference radix both say; the pass is counted as a
    cascade."""
    ps = params["page_size"]
    s = make_subject(params, core="python")
    _family(s, ps)
    assert SPEC.ops.apply(s, Op("evict", {"n": 3 * ps})) is not None
    ev = next(e for e in s._policy_events if e[0] == "evict")
    keys = [ev[2].nodes[v].key for v in ev[3]]
    assert sorted(keys[:2]) == [(2,) * ps, (3,) * ps] and keys[2] == (1,) * ps, keys
    s.check()
    assert [n.key for n in s.tree_view().nodes.values() if n.key] == [(4,) * ps]
    assert s.reached_counts["cascade-eviction"] == 1


@pytest.mark.parametrize("patched", [False, True])
def test_a_patched_upstream_taking_the_mru_victim_is_caught_on_victim(patched):
    """Upstream patched to evict the most recently used leaf first -- the Full heap on
    SGLang's own ``MRUStrategy`` (``--radix-eviction-policy mru``) -- is reported on ``victim``
    the step it happens; unpatched, the same ops pass and the older leaf goes."""
    from sglang.srt.mem_cache.evict_policy import MRUStrategy

    s = make_subject(REGIMES[0], core="python")
    if patched:
        s.cache.tree.tree_core.eviction_strategy = MRUStrategy()  # bound at the walk's start
    for tokens in ([1], [2]):
        s.insert(tokens)
        s.check()
    SPEC.ops.apply(s, Op("evict", {"n": 1}))
    if not patched:
        s.check()
        assert [n.key for n in s.tree_view().nodes.values() if n.key] == [(2,)]
        return
    with pytest.raises(Violation) as exc:
        s.check()
    assert exc.value.prop == "victim", exc.value


def test_policy_fault_P1_in_the_full_component_caught_on_victim(tmp_path):
    """P1 (``mru-victim``) patched into 0.5.23's ``FullComponent`` (the device heap's key
    negated), Python core: caught on ``victim``, shrunk, replayed; the ops pass unpatched."""
    from tests.harness import assert_caught_on_upstream

    assert_caught_on_upstream(SPEC, REGIMES[0], "P1", tmp_path, target="sglang")


# -- allocation: 0.5.23's scheduler evicts the shortfall, through evict_for_alloc ---------------

def _nearly_full(params):
    """A subject whose pool is one leaf short of full: leaves of ``L`` tokens (2 on page 1, a
    page when paged), each older than the next, and ``L`` tokens free; returns (subject, L)."""
    s = make_subject(params, core="python")
    ps = params["page_size"]
    leaf = 2 if ps == 1 else ps
    cap = params["pool_pages"] * ps
    for i in range(cap // leaf - 1):
        s.insert([100 + i] * leaf)
        s.check()
    assert s.cache.allocator.available_size() == leaf
    return s, leaf


@pytest.mark.parametrize("params", REGIMES, ids=IDS)
def test_an_allocation_on_a_nearly_full_pool_evicts_only_the_shortfall(params):
    """Allocating 4 tokens with ``L`` free: the scheduler's request is 4 (page 1) or 4 + a page
    (paged), ``L`` short -- 0.5.23 (``evict_from_tree_cache`` -> ``evict_to_free_tokens`` ->
    ``evict_for_alloc``) evicts that shortfall, one leaf (0.5.12 evicted the whole request, two
    leaves).  Counted on what upstream reports evicting, and on the victims the subject
    recorded for the allocation; the policy checks pass."""
    s, leaf = _nearly_full(params)
    results = logged_evict_for_alloc(s.cache.tree)
    free = s.cache.allocator.available_size()
    ps = params["page_size"]
    shortfall = 4 + (ps if ps > 1 else 0) - free
    assert shortfall == leaf
    s.insert([7, 7, 7, 7])
    assert results == [(shortfall, leaf)], results  # asked the shortfall, evicted one leaf
    allocs = [ev for ev in s._policy_events if ev[0] == "alloc"]
    assert [ev[1] for ev in allocs] == [(4, shortfall)]  # the declared need: 0.5.23's
    assert len(allocs[0][3]) == 1  # one victim, seen through evict_for_alloc
    assert s.__dict__.get("reached_counts", {}).get("alloc-evicted", 0) == 1  # counted
    s.check()


@pytest.mark.parametrize("params", REGIMES, ids=IDS)
def test_an_adapter_evicting_the_whole_request_is_over_eviction(monkeypatch, params):
    """The 0.5.12.post1 path (evict all of ``extend + page`` through ``evict`` once short) on
    0.5.23: the second leaf goes after the declared need (the shortfall) was met -- caught on
    ``over-eviction``."""
    from caches.adapters.sglang.unified_radix import UnifiedRadixAdapter

    def whole_request(self, num_tokens):
        ps = self.page_size
        need = num_tokens + (ps if ps > 1 else 0)
        if self.allocator.available_size() < need:
            self.evict(need)
        got = self.allocator.alloc(-(-num_tokens // ps) * ps)
        return None if got is None else got[:num_tokens].tolist()

    monkeypatch.setattr(UnifiedRadixAdapter, "alloc_with_eviction", whole_request)
    s, leaf = _nearly_full(params)
    s.insert([7, 7, 7, 7])
    with pytest.raises(Violation) as exc:
        s.check()
    assert exc.value.prop == "over-eviction", exc.value
