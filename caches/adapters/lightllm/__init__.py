"""LightLLM's real ``LinearAttPagedRadixCache`` from a source checkout (target ``lightllm``)."""
