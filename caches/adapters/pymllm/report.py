"""What ``kvcheck report`` needs from the pymllm radix adapter (``ReportSetup``): pymllm is
loaded from a checkout of UbiquitousLearning/mllm, so the script puts that checkout on
``sys.path`` (the one the trace ran against, or one given to the script), gives
``radix_cache`` the loader's logical clock, and checks the radix properties in pymllm's terms.
"""

from __future__ import annotations

import inspect

from caches.adapters.pymllm import loader
from caches.adapters.radix_report import radix_checks
from caches.reporting import ReportSetup

RADIX_CHECKS = radix_checks("cache.evictable_size()", "cache.protected_size()")


def preamble(src: str) -> str:
    return (
        "# pymllm is loaded from a checkout of UbiquitousLearning/mllm (as kvcheck's pymllm\n"
        "# loader does): the script's first argument, else $MLLM_SRC, else the checkout the\n"
        "# finding was recorded on.  Nothing is stood in.\n"
        "import os\n\n"
        f"SRC = sys.argv[1] if len(sys.argv) > 1 else os.environ.get('MLLM_SRC', {src!r})\n"
        "sys.path[:0] = [SRC, os.path.join(SRC, 'mllm-kernel')]\n"
        "import time\n\n\n" + inspect.getsource(loader.LogicalTime).rstrip())


AFTER_IMPORT = (
    "# RadixCache stamps nodes with time.monotonic(); as in kvcheck's loader, a logical clock\n"
    "# (one tick per call) makes the LRU order, and so every eviction, the recorded one.\n"
    "from pymllm.mem_cache import radix_cache as _radix_cache\n"
    "_radix_cache.time = LogicalTime(_radix_cache.time)")


def radix_setup(adapter) -> ReportSetup:
    return ReportSetup(
        engine="pymllm", version="", driven="pymllm.mem_cache.radix_cache.RadixCache",
        built=adapter.built, checks=RADIX_CHECKS, preamble=preamble(adapter.src),
        after_import=AFTER_IMPORT, anchors={"cache.root_node": adapter.tree.root_node},
        interpreter="python")
