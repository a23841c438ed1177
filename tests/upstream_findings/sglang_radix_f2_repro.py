"""Stand-alone reproduction of sglang-radix-F2 on SGLang 0.5.23 (only sglang and torch needed).

sgl-project/sglang issue #35270: a diffusion LM's in-flight block -- the request's trailing
page (``_dllm_page_size`` pins ``page_size`` to the dLLM ``block_size``), whose token ids are
rewritten on every denoising step while its KV slots stay the same (an unresolved FDFO block
keeps them, ``mem_cache/allocation.py`` ``reuse_kv``) -- is checkpointed into the tree.  The
next step's key diverges at the block, the match ends below ``cache_protected_len``, nothing is
freed as a duplicate, and two nodes own the same pages: ``evictable + protected + available``
exceeds the pool, the condition the scheduler's idle pool check raises on.

The calls are ``UnifiedRadixCache.checkpoint(req, up_to=...)`` -- what ``checkpoint_kv_cache``
(``mem_cache/common.py``) issues after a forward -- over SGLang's own allocator, request pool
and ``ReqKvInfo``.  0.5.23's scheduler does **not** issue them for an unresolved FDFO block
(``dllm/mixin/scheduler.py`` ``finish_dllm_forward`` returns first): on 0.5.23 this is a
hardening finding about the tree, which keys whatever fill ids it is given (the fix the issue's
PR #35470 / #35781 proposes: ``get_cacheable_fill_ids``).

    python tests/upstream_findings/sglang_radix_f2_repro.py [--rust]

Prints the tree after each step; ``BROKEN`` and exit 1 when a KV slot is owned twice, ``ok``
and exit 0 otherwise.  ``--rust``: the Rust tree core.  The trace this follows:
``sglang-0.5.23-radix-F2-dllm-block-double-owned.json`` (kvcheck's ``dllm_step`` op).
"""

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from array import array


def _import_stand_ins() -> None:
    """On a CPU machine: sglang imports ``sgl_kernel`` (GPU-only) and ``torchvision`` at module
    level; where they are missing, each is a module whose attributes are placeholders (never
    called on the KV-cache path used here)."""
    missing = [n for n in ("sgl_kernel", "torchvision") if importlib.util.find_spec(n) is None]

    class Placeholder(types.ModuleType):
        __path__: list = []
        __version__ = "0.28.0"  # what transformers reads of torchvision

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return Placeholder(f"{self.__name__}.{name}")

        def __call__(self, *args, **kwargs):
            raise RuntimeError(f"stand-in {self.__name__} called")

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in missing:
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            return Placeholder(spec.name)

        def exec_module(self, module):
            pass

    if missing:
        sys.meta_path.insert(0, Finder())


_import_stand_ins()
warnings.simplefilter("ignore")

import torch  # noqa: E402
from sglang.srt.managers.schedule_batch import ReqKvInfo  # noqa: E402
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import TreeLock  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402

CORE = "rust" if "--rust" in sys.argv[1:] else "python"
PAGE, PAGES = 4, 6  # the page is the dLLM block
TOTAL = PAGE * PAGES

allocator = PagedTokenToKVPoolAllocator(TOTAL, PAGE, torch.float16, "cpu", None, False)
req_to_token_pool = ReqToTokenPool(TOTAL, 2 * TOTAL + PAGE, "cpu", False)
tree = UnifiedRadixCache(CacheInitParams(
    disable=False, req_to_token_pool=req_to_token_pool, token_to_kv_pool_allocator=allocator,
    page_size=PAGE, tree_components=(ComponentType.FULL,), tree_core_backend=CORE))

# a running dLLM request with a 2-token prompt: its first block is the prompt + 2 undecided
# positions, one page, computed over slots it allocated (the fields checkpoint reads of a Req)
req = types.SimpleNamespace(
    rid="r1", kv=ReqKvInfo(), lock=None, last_node=None, origin_input_ids=array("q", [0, 0]),
    full_untruncated_fill_ids=array("q"), output_ids=[], priority=0, session_id=None,
    session=None, kv_rotation_base=None, extra_key=None, cache_salt=None,
    skip_radix_cache_insert=False, finished_len=None, finished_reason=None,
    reasoning_tokens=0, prefix_len=0, finished=lambda: False)
req_to_token_pool.alloc([req])
slots = allocator.alloc(PAGE)
req_to_token_pool.write((req.kv.req_pool_idx, slice(0, PAGE)), slots.to(torch.int32))
req.kv.kv_allocated_len = PAGE
root = tree.tree_core.root_node_handle()
req.last_node = root
req.lock = TreeLock(root, tree.inc_lock_ref(root).to_dec_params())  # the admission's lock


def state() -> str:
    ev, pr = int(tree.tree_core.evictable_size()), int(tree.tree_core.protected_size())
    avail = int(allocator.available_size())
    held = tree.tree_core.all_values_flatten().tolist()
    return (f"tree slots {sorted(held)}; evictable {ev} + protected {pr} + available {avail} "
            f"= {ev + pr + avail} (pool {TOTAL})"), held


print(f"sglang UnifiedRadixCache ({CORE} tree core), page {PAGE}, pool {TOTAL} tokens; "
      f"the block's slots {slots.tolist()}")
for step, block in enumerate(([1, 2], [2, 0]), start=1):
    # a denoising step rewrote the block's undecided ids over the same slots; the scheduler
    # then checkpoints what the request computed (checkpoint_kv_cache: up_to = extend_end)
    req.full_untruncated_fill_ids = array("q", [0, 0] + block)
    req.kv.kv_committed_len = PAGE
    tree.checkpoint(req, up_to=PAGE)
    words, held = state()
    print(f"step {step}: key {list(req.full_untruncated_fill_ids)} checkpointed: {words}")
    twice = sorted({s for s in held if held.count(s) > 1})
    if twice:
        print(f"BROKEN at step {step}: KV slot(s) {twice} are owned by two tree nodes (the "
              f"block's key under two versions); the idle pool check would see "
              f"{words.split('; ')[1]}")
        sys.exit(1)
print("ok")
