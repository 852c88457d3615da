"""Parallel training: data parallelism (buckets, overlap, averaging) and batch sharding."""

from gpurig.parallel.data_parallel import DataParallel, ModelMismatchError, assign_buckets
from gpurig.parallel.numerics import NonFiniteGradientError, NonFiniteGradientWarning
from gpurig.parallel.sharding import BatchSizeWarning, shard, tile_advice

__all__ = ["DataParallel", "ModelMismatchError", "assign_buckets", "BatchSizeWarning", "shard", "tile_advice",
           "NonFiniteGradientError", "NonFiniteGradientWarning"]
