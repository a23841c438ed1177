"""The variant names, without importing a variant (each pulls in torch through its subject's
pools): what a command checks ``--variant`` against before any work.
``tests/test_bad_input.py`` keeps it equal to ``variants.SPECS``."""

NAMES = ("radix", "paged-bigpage", "streaming-session", "himamba", "continuation-state",
         "block-hash", "hybrid-swa")


def unknown_variant(name: str) -> str:
    return f"unknown variant {name!r}; known: {', '.join(NAMES)}"
