"""python -m chatloom: the command line (app.cli)."""

import sys

from chatloom import main

sys.exit(main())
