"""SGLang targets: ``loader`` (import shims, pinned release), ``radix`` (``--target sglang``
for the radix variant), ``faults`` (catalogued faults as patches of the real methods)."""
