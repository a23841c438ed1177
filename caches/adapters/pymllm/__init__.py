"""pymllm target (``--target pymllm --src PATH``): ``loader`` (imports a checkout of
UbiquitousLearning/mllm without leaking it), ``radix`` (pymllm's ``RadixCache`` driven as its
model runner drives it), ``faults`` (catalogued faults as patches of the real methods)."""
