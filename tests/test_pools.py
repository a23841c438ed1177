"""Pools: upstream allocation rules, device placement, fingerprint storage."""

import pytest
import torch

from caches.pools import Fingerprint, PagedAllocator, StatePool, TokenSlotAllocator


def test_token_slots_reserve_zero_and_run_out():
    a = TokenSlotAllocator(4, device="cpu")
    got = a.alloc(3)
    assert got == [1, 2, 3] and 0 not in got
    assert a.alloc(2) is None and a.available_size() == 1
    a.free([2])
    assert sorted(a.view().free) == [2, 4]


def test_paged_free_releases_whole_pages():
    a = PagedAllocator(3, page_size=4, device="cpu")
    slots = a.alloc(6)  # two pages, the request owns all 8 slots
    assert slots == [4, 5, 6, 7, 8, 9] and a.available_size() == 4
    a.free([9])  # one token of page 2 frees the whole page
    assert sorted(a.view().free) == [2, 3]
    a.free([8])  # ...and freeing it again is not detected here (the invariants detect it)
    assert a.view().free.count(2) == 2
    assert a.pages_of([4, 5, 9, 10]) == [1, 2]


def test_state_pool():
    s = StatePool(2, device="cpu")
    assert s.alloc(2) == [1, 2] and s.alloc() is None
    s.free([1])
    assert s.view().free == (1,) and s.view().capacity == 2


def test_fingerprints_round_trip_on_the_data_tensor():
    a = PagedAllocator(2, page_size=2, device="cpu")
    fp = Fingerprint.of_prefix([5, 6, 7])
    ids = a.alloc(3)
    a.write(ids, fp)
    assert a.read(ids) == fp and a.data.device.type == "cpu"
    assert Fingerprint.of_prefix([5, 6]) == fp[:2]
    assert Fingerprint.of_prefix([6, 6])[1] != fp[1]


def test_cpu_writes_land_in_the_tensor_as_torch_would_put_them():
    """On the CPU the pools write and read through a numpy array over the tensor's memory: the
    tensor itself must hold what a torch write would have put there (runs and scattered ids),
    reads must see writes made through torch, and a pool without the view (torch ops only)
    gives the same values."""
    import random

    rnd = random.Random(0)
    fast, slow = StatePool(40, device="cpu"), StatePool(40, device="cpu")
    slow._host = None  # the torch path (what CUDA takes)
    assert fast._host is not None
    for _ in range(200):
        if rnd.random() < 0.5:
            a = rnd.randrange(0, 35)
            ids = list(range(a, a + rnd.randrange(1, 6)))
        else:
            ids = rnd.sample(range(41), rnd.randrange(1, 6))
        vals = [rnd.randrange(2**31) for _ in ids]
        fast.write(ids, vals)
        slow.write(ids, vals)
        assert torch.equal(fast.data, slow.data)
        assert fast.read(ids) == slow.read(ids) == vals
    fast.data[7] = 12345  # a write through torch (as a test's corruption does) reads back
    assert fast.read([7]) == [12345] and fast.snapshot()[7] == 12345
    with pytest.raises(IndexError):
        fast.write([41], [1])


def test_bad_arguments_are_clear():
    with pytest.raises(ValueError, match="page_size"):
        PagedAllocator(2, page_size=0, device="cpu")
    with pytest.raises(ValueError, match="unknown device"):
        PagedAllocator(2, device="tpu9")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            PagedAllocator(2, device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_pools_live_on_cuda():
    a = PagedAllocator(4, page_size=2, device="cuda")
    s = StatePool(2, device="cuda")
    ids = a.alloc(3)
    a.write(ids, [1, 2, 3])
    assert a.data.is_cuda and s.data.is_cuda and a.read(ids) == [1, 2, 3]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_radix_machine_on_cuda():
    from state_machines.fuzz import fuzz
    from state_machines.variants import get_variant

    from state_machines.run import Run

    spec = get_variant("radix")
    run = Run(spec, spec.regimes[1], device="cuda")  # what each example builds
    assert run.subject.pool.data.is_cuda and run.subject.pool.device.type == "cuda"
    out = fuzz(spec, spec.regimes[1], device="cuda", max_examples=20)
    assert not out.failed and out.error is None
    assert out.examples > 0 and out.steps > 0


def test_window_pool_pairs_with_the_full_pool_on_the_device_asked_for():
    from caches.window_pool import SWAPagedAllocator

    a = SWAPagedAllocator(3, 2, page_size=2, device="cpu")
    assert a.window.device == a.device and a.window.data.device == a.data.device
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            SWAPagedAllocator(2, 2, device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_window_pool_lives_on_cuda():
    from caches.window_pool import SWAPagedAllocator

    a = SWAPagedAllocator(3, 2, page_size=2, device="cuda")
    ids = a.alloc(3)
    a.window.write(a.translate(ids), [4, 5, 6])
    assert a.data.is_cuda and a.window.data.is_cuda and a.window.read(a.translate(ids)) == [4, 5, 6]


def test_consistent_slots_is_consistent_over_pages_of():
    """``consistent_slots`` (owners' slot lists, pages as sets) gives the verdict of
    ``consistent`` over ``pages_of`` each list, on random paged pools: clean partitions of the
    pages into slot lists, and ones with a page moved, shared, dropped or freed twice."""
    import random

    rnd = random.Random(1)
    clean = 0
    for _ in range(5000):
        ps, n = rnd.choice([1, 2, 4]), rnd.randint(1, 6)
        pool = PagedAllocator(n, page_size=ps, device="cpu")
        pages = list(range(1, n + 1))
        rnd.shuffle(pages)
        k = rnd.randint(0, n)
        pool.free_pages, rest = pages[:k], pages[k:]
        owners = []
        while rest:
            j = rnd.randint(1, len(rest))
            mine, rest = rest[:j], rest[j:]
            slots = [p * ps + i for p in mine for i in range(ps) if rnd.random() < 0.7]
            owners.append(slots or [mine[0] * ps])
        borrowed = [[rnd.randrange(ps * (n + 1)) for _ in range(rnd.randint(0, 2))]
                    for _ in range(rnd.randint(0, 2))]
        r = rnd.random()
        if r < 0.15 and owners:
            rnd.choice(owners).append(rnd.randrange(ps * (n + 2)))
        elif r < 0.25 and owners:
            owners.pop(rnd.randrange(len(owners)))
        elif r < 0.35 and pool.free_pages:
            pool.free_pages.append(rnd.choice(pool.free_pages))
        want = pool.consistent([pool.pages_of(o) for o in owners],
                               [pool.pages_of(b) for b in borrowed])
        assert pool.consistent_slots(owners, borrowed) == want, (ps, pool.free_pages, owners,
                                                                 borrowed)
        clean += want
    assert 500 < clean < 4500  # both verdicts are exercised


def test_native_workers_start_by_fork_on_the_cpu_and_spawn_on_a_gpu():
    from state_machines.native import _start_method

    assert _start_method("cpu") == "fork"
    if torch.cuda.is_available():
        assert _start_method("cuda") == _start_method(None) == "spawn"
    else:
        assert _start_method(None) == "fork"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_native_workers_run_on_cuda_after_the_parent_used_it():
    """A process that has used CUDA cannot fork workers that use it: the native engine's
    workers on a GPU start by spawn, and find the fault a one-process run finds."""
    from state_machines.native import native_fuzz
    from state_machines.variants import get_variant

    spec = get_variant("radix")
    one = native_fuzz(spec, spec.regimes[0], fault="R4", max_walks=200, seed=5, workers=1,
                      device="cuda")  # the parent has now initialised CUDA
    assert torch.cuda.is_initialized()
    two = native_fuzz(spec, spec.regimes[0], fault="R4", max_walks=200, seed=5, workers=2,
                      device="cuda")
    assert one.failed and two.failed and one.prop == two.prop == "ref-balance"
