"""vLLM's real KV cache manager (``vllm.v1.core``) as kvcheck targets: ``loader.py`` finds the
pinned install (``ci/upstream/vllm-setup.sh``), ``block_hash.py`` adapts ``KVCacheManager`` +
``BlockPool`` to the block-hash variant, ``target.py`` registers the ``vllm`` target."""
