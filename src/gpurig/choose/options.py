"""The options ``gpurig choose`` ranks: each candidate GPU at each count, and whole clusters as ``predict`` takes
them, each as a cluster ``predict`` reads and a build ``plan`` reads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpurig.choose.request import ChooseRequest, counts
from gpurig.errors import UsageError
from gpurig.hardware.plan import inputs
from gpurig.spec import catalog
from gpurig.spec.build import Build
from gpurig.spec.cluster import load_spec
from gpurig.spec.prices import gpu_prices

RECENT_ARCHITECTURES = 2   # the default candidates: the newest NVIDIA architectures with a purchase price


@dataclass(frozen=True)
class Option:
    """One thing to buy or rent: ``cluster`` as ``predict --cluster`` takes it, ``build`` as ``plan`` reads it."""

    label: str
    cluster: str
    build: Build
    gpu: str | None = None     # the candidate GPU, for the options made of one (None: a cluster as given)

    @property
    def gpus(self) -> int:
        """GPUs in the whole option.

        >>> option("2 x RTX 4090").gpus
        2
        """
        return self.build.total_gpus

    def gpu_models(self) -> dict[str, int]:
        """GPUs of each model in the whole option.

        >>> option("2 nodes x 1 GTX 980, 1 Gbit/s Ethernet").gpu_models()
        {'GeForce GTX 980': 2}
        """
        out: dict[str, int] = {}
        for machine in self.build.machines():
            for group in machine.gpus:
                out[group.gpu.name] = out.get(group.gpu.name, 0) + group.count * machine.nodes
        return out


def option(cluster: str, label: str | None = None, gpu: str | None = None) -> Option:
    """The option a cluster names: a one-line description or a cluster spec file (not a measured profile: a
    profile is this machine, which has no price).

    >>> option("4 x GTX Titan X").build.gpu_count
    4
    >>> option("examples/cluster-3+1-titan.toml").label
    '3 + 1 GTX Titan (cluster-3+1-titan.toml)'
    >>> option("runs/bench/profile.json")
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --cluster runs/bench/profile.json: a measured profile cannot be bought; give a description such as '2 x RTX 4090' or a cluster spec (.toml)
    """
    if cluster.endswith(".json"):
        raise UsageError(f"--cluster {cluster}: a measured profile cannot be bought; give a description such as "
                         "'2 x RTX 4090' or a cluster spec (.toml)")
    is_file = cluster.endswith(".toml") or Path(cluster).is_file()
    build = inputs(spec_file=cluster) if is_file else inputs(description=cluster)
    if label is None and is_file:
        name = load_spec(cluster).name
        label = f"{name} ({Path(cluster).name})" if name else cluster
    return Option(label or cluster, cluster, build, gpu)


def default_candidates(cloud: bool) -> list[str]:
    """The catalog's GPUs of the newest architectures with a purchase price (with ``cloud``, also the recent
    GPUs with a cloud price).

    >>> default_candidates(False)
    ['GeForce RTX 4060 Ti 8 GB', 'GeForce RTX 4060 Ti 16 GB', 'GeForce RTX 4070', 'GeForce RTX 4070 Ti SUPER', 'GeForce RTX 4080', 'GeForce RTX 4090', 'GeForce RTX 5070', 'GeForce RTX 5080', 'GeForce RTX 5090', 'RTX 6000 Ada']
    """
    priced = [catalog.gpu(name) for name, row in gpu_prices().items()]
    bought = [g for g in priced if g.vendor == "NVIDIA" and (gpu_prices()[g.name].launch_usd or
                                                             gpu_prices()[g.name].street_usd)]
    newest: dict[str, int] = {}
    for gpu in bought:
        newest[gpu.architecture] = max(newest.get(gpu.architecture, 0), gpu.year)
    architectures = sorted(newest, key=newest.get)[-RECENT_ARCHITECTURES:]
    chosen = [g for g in bought if g.architecture in architectures]
    if cloud:
        since = min(g.year for g in chosen)
        chosen += [g for g in priced if gpu_prices()[g.name].cloud_usd_per_gpu_hour and g.year >= since
                   and g not in chosen]
    order = {g.name: i for i, g in enumerate(catalog.gpus())}
    return sorted({g.name for g in chosen}, key=order.get)


def gpu_options(request: ChooseRequest) -> list[Option]:
    """Each candidate GPU (``--candidates`` or the default) at each count; an unknown GPU is one line with the
    closest names.

    >>> [o.label for o in gpu_options(ChooseRequest(model="m", candidates=("RTX 4090", "4090"), max_gpus=2))]
    ['1 × GeForce RTX 4090', '2 × GeForce RTX 4090']
    """
    names = request.candidates if request.candidates else () if request.clusters else \
        tuple(default_candidates(request.cloud))
    out, seen = [], set()
    for name in names:
        gpu = catalog.gpu(name)
        if gpu.name in seen:  # "4090, RTX 4090": one GPU named twice is one candidate
            continue
        seen.add(gpu.name)
        for n in counts(request):
            out.append(option(f"{n} x {gpu.name}", f"{n} × {gpu.name}", gpu.name))
    return out


def parse_candidates(text: str) -> tuple[str, ...]:
    """``--candidates "RTX 4090, A100 80GB"`` as names.

    >>> parse_candidates("RTX 4090, A100 PCIe 80 GB,")
    ('RTX 4090', 'A100 PCIe 80 GB')
    """
    return tuple(name.strip() for name in text.split(",") if name.strip())
