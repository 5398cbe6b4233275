"""``python -m trl_ext`` = the ``trl-ext`` command (so ``accelerate launch -m trl_ext train RECIPE`` works)."""

import sys

from .cli import main

sys.exit(main())
