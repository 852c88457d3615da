"""Parallel training: data parallelism (buckets, overlap, averaging), batch sharding, model and hybrid parallelism,
mixed precision whose skipped steps the ranks agree on, sharded optimizer state and gradients (ZeRO)."""

from gpurig.parallel.data_parallel import DataParallel, ModelMismatchError, assign_buckets
from gpurig.parallel.memory import optimizer_state_bytes, parameter_bytes
from gpurig.parallel.mixed_precision import MixedPrecision
from gpurig.parallel.model_parallel import ColumnParallelLinear, RowParallelLinear
from gpurig.parallel.numerics import NonFiniteGradientError, NonFiniteGradientWarning
from gpurig.parallel.split_model import ModelParallel, parallelize
from gpurig.parallel.layer_plan import PlanError, krizhevsky_plan, resolve_plan
from gpurig.parallel.sharding import BatchSizeWarning, shard, tile_advice
from gpurig.parallel.zero_optimizer import ZeroRedundancyOptimizer

__all__ = ["DataParallel", "ModelMismatchError", "assign_buckets", "BatchSizeWarning", "shard", "tile_advice",
           "ColumnParallelLinear", "RowParallelLinear", "ModelParallel", "parallelize", "PlanError",
           "krizhevsky_plan", "resolve_plan", "parameter_bytes", "optimizer_state_bytes",
           "NonFiniteGradientError", "NonFiniteGradientWarning", "MixedPrecision", "ZeroRedundancyOptimizer"]
