"""Load our Hypothesis profile before any machine is imported.

With ``CI`` set Hypothesis would load its own built-in ``ci`` profile; a machine's
``TestCase.settings`` is frozen at first access, so this must run first.  Default: ``ci``
(derandomised, fixed budget), or ``$HYPOTHESIS_PROFILE``.
"""

import os

from state_machines.profiles import load_profile

load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "ci")
