"""The prediction ``gpurig train`` prints beside what it measured: this job's ranks and links measured
(about 10 s on CPU ranks), then ``gpurig predict``'s split for the run's own configuration."""

from __future__ import annotations

import json
from pathlib import Path

from gpurig.train.config import TrainConfig


def calibrate(comm, config: TrainConfig) -> str:
    """Measure this job's ranks and links (:mod:`gpurig.measure.calibrate`, about 10 s on CPU ranks); rank 0 saves the profile.

    Returns where: ``<checkpoint dir>/profile.json``, which ``gpurig predict --cluster`` also reads.
    """
    from gpurig.measure.calibrate import job_profile
    from gpurig.parallel import auto

    # the compressed averages this run may use are timed whole, as gpurig bench does ("auto": each it may choose)
    candidates = auto.parse(config.compression)
    if config.parallel == "model" or config.compression == "none":
        compressed: tuple[str, ...] = ()
    else:
        compressed = candidates[1:] if candidates else (config.compression,)
    profile = job_profile(comm, compressed)
    path = Path(config.checkpoint_dir) / "profile.json"
    if comm.rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(profile, indent=2))
    return str(path)


def prediction(config: TrainConfig, comm, profile_path: str, dp, sample_shape: tuple[int, ...] = ()) -> dict:
    """``gpurig predict``'s step split for this run's configuration (rank 0), or why there is none.

    A user's ``module:factory`` model is priced as ``gpurig predict --model module:factory --sample SHAPE``
    prices it, ``sample_shape`` being one input of the run's data.
    """
    from gpurig.parallel import auto
    from gpurig.predict import PredictRequest, predict, predicted_split
    from gpurig.train.sources import is_users

    method = config.compression
    if auto.parse(method) is not None:
        method = (dp.auto_choice or {}).get("codec", "none") if dp is not None else "none"
    per_rank = config.global_batch // comm.size
    engine = comm.engine.name   # predict's --engine: "mpi" or "torch" (comm.engine_name says "torch/gloo")
    try:
        if is_users(config.model):
            sample = "x".join(str(n) for n in sample_shape)
            split = predict(PredictRequest(model=config.model, cluster=profile_path, batch=per_rank, gpus=comm.size,
                                           compression=method, parallel=config.parallel, engine=engine,
                                           sample=sample, shard=config.shard, optimizer=config.optimizer))["step"]
        else:
            split = predicted_split(config.model, profile_path, comm.size, per_rank, method, config.parallel,
                                    engine, shard=config.shard, optimizer=config.optimizer)
    except Exception as error:  # a prediction must never cost the user the run
        return {"error": str(error).splitlines()[0]}
    return {**{k: round(v, 3) for k, v in split.items()}, "compression": method, "profile": profile_path}
