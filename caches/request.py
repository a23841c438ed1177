"""The request record the scheduler hands a cache (upstream's ``Req``, reduced to the cache's view)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Req:
    """A live request as the cache sees it.

    ``tokens`` is the whole sequence the request computes; ``kv_indices`` its row of the
    request-to-token table (pool ids for ``tokens[:len(kv_indices)]``); ``filled`` how many
    positions have KV computed; ``cache_protected_len`` how long a prefix the tree owns (the
    request only borrows those ids); ``last_node`` the node the request holds locked.
    ``volatile``: how many trailing tokens are not final -- a diffusion LM's in-flight block
    (SGLang's ``Req.dllm_incomplete_ids``), rewritten every denoising step; no cache may key
    on them (sgl-project/sglang issue #35270).  ``swa_evicted_seqlen`` (a cache with a
    sliding-window pool): the request's positions below it had their window KV freed (SGLang's
    ``req.kv.get_evicted_seqlen(SWA)``).
    """

    rid: int
    tokens: list[int]
    kv_indices: list[int] = field(default_factory=list)
    filled: int = 0
    cache_protected_len: int = 0
    last_node: object = None
    max_new: int = 0
    output: int = 0
    retracted: int = 0
    volatile: int = 0
    swa_evicted_seqlen: int = 0  # sliding window: positions below have no window KV left

    @property
    def own_indices(self) -> list[int]:
        """Ids the request itself holds (allocated, not yet owned by the tree)."""
        return self.kv_indices[self.cache_protected_len:]

    @property
    def borrowed_indices(self) -> list[int]:
        """Ids the request reads but the tree owns (its locked prefix)."""
        return self.kv_indices[: self.cache_protected_len]
