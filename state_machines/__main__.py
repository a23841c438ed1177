import sys

from state_machines.cli import main

sys.exit(main())
