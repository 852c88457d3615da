"""``gpurig train``, the main job: data-, model- or hybrid-parallel training of a reference model on all local ranks.

Two halves. :func:`launch_training` (:mod:`~gpurig.train.job`) runs where the
user typed the command: it checks the configuration (:mod:`~gpurig.train.config`),
starts N ranks through :mod:`gpurig.launch` and relays rank 0's progress events.
:func:`train_on_this_rank` (:mod:`~gpurig.train.loop`) runs in every rank: the
training loop, with the measured split of each step into computation,
communication not hidden under backward, waiting for slower ranks, and data
loading — the terms ``gpurig predict`` uses. Checkpoints: :mod:`~gpurig.train.checkpoints`;
the data sets: :mod:`~gpurig.train.data`.
"""

from gpurig.train.config import TrainConfig, validate
from gpurig.train.job import launch_training

__all__ = ["TrainConfig", "validate", "launch_training"]
