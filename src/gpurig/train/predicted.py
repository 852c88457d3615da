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


def prediction(config: TrainConfig, comm, profile_path: str, dp) -> dict:
    """``gpurig predict``'s step split for this run's configuration (rank 0), or why there is none."""
    from gpurig.parallel import auto
    from gpurig.predict import predicted_split

    method = config.compression
    if auto.parse(method) is not None:
        method = (dp.auto_choice or {}).get("codec", "none") if dp is not None else "none"
    try:
        split = predicted_split(config.model, profile_path, comm.size, config.global_batch // comm.size, method,
                                config.parallel, comm.engine_name)
    except Exception as error:  # a prediction must never cost the user the run
        return {"error": str(error).splitlines()[0]}
    return {**{k: round(v, 3) for k, v in split.items()}, "compression": method, "profile": profile_path}
