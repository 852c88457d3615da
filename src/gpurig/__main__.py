"""``python -m gpurig`` is the ``gpurig`` command."""

import sys

from gpurig.cli import main

sys.exit(main())
