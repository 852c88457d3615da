"""One rank of ``gpurig train``: ``python -m gpurig.train CONFIG.json`` (what :func:`~gpurig.train.job.launch_training` starts)."""

import sys

from gpurig.train.loop import main

sys.exit(main(sys.argv[1:]))
