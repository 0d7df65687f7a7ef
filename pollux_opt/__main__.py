"""``python -m pollux_opt``: the ``pollux-opt`` command."""

import sys

from pollux_opt.cli import main

sys.exit(main())
