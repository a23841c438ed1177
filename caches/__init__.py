"""Systems under test: torch pools, reference caches, their faults, subjects and adapters."""
