"""``compression="auto"``: choose each bucket's method from what this run measured.

The decision is a small model of one backward pass, fed only with measurements:

- when each bucket leaves (how much backward is still to run after its
  gradients are ready: its *lead*), from the run's own steps;
- the network: the latency of one collective (a few tiny allreduces) and its
  bandwidth (the largest bucket allreduced on its own); the bandwidth that would
  explain the wait the steps measured at the end of backward
  (:func:`fit_bandwidth`) is kept beside it, to show how well the model fits;
- what each method costs on this device for each bucket (timed here), and
  how long each method's whole chain holds the link, timed on the largest
  bucket: the model's link time is scaled to it (:func:`link_scale`).

Buckets travel one after another on one link: bucket b starts when it is ready
and the previous one is done, and takes ``latency · collectives + bytes / bandwidth``.
What sticks out past the end of backward is waited for. On a CPU the codec's
arithmetic runs on the cores that compute, so it adds to the step; on a GPU it
sits in the communication pipeline. :func:`choose` takes, per bucket, the least
lossy method whose predicted step is within a margin of the fastest assignment
— a bucket hidden under backward anyway stays uncompressed — and ``none``
everywhere unless compressing saves at least :data:`MARGIN` of the wait.

The model ranks; real steps decide what it cannot tell apart. When the choice
compresses, :func:`shortlist` names the assignments predicted close to it
(each method on every bucket), DataParallel trains a few steps with each, and
keeps the fastest measured — the model's choice unless another is clearly
faster. On a CPU a codec and backward share the cores, and the model misses
how they mix: behind an emulated 1 Gbit/s link it put int8 on the large
bucket within half a millisecond of PowerSGD on both, where the steps
measured 41–43 ms against 36.

A choice is reviewed from the steps' own timings: when the wait at the end of
backward has moved far from the wait once the choice settled (:func:`drifted`),
at two reviews in a row, the link or the load has changed, and DataParallel
measures and decides again.

``"auto"`` chooses among :data:`CANDIDATES`; ``"auto:fp16,int8"`` among the
methods named (and ``none``), e.g. to leave PowerSGD out (:func:`parse`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpurig.parallel.compression import POWERSGD, method_names, parse_method
from gpurig.perf import overlap

# Least to most lossy. PowerSGD comes last: its error is not bounded per value (a low-rank projection, repaid
# by error feedback over later steps), so it is taken only where it beats int8 by more than the margin
# :func:`choose` gives back for precision. Behind 1 Gbit/s it trains the reference MLP to int8's accuracy
# (tests/test_train.py) in 0.8x int8's step time (docs/benchmarks.md).
CANDIDATES = ("none", "fp16", "int8", POWERSGD)
_LOSSINESS = ("none", "fp16", "bf16", "int8", "int8-dynamic", POWERSGD)


def parse(compression: str) -> tuple[str, ...] | None:
    """The methods ``compression`` lets auto choose from, least lossy first; None when it is not auto.

    Raises ValueError, naming the choices, for an unknown method after ``auto:``.

    >>> parse("auto"), parse("int8")
    (('none', 'fp16', 'int8', 'powersgd'), None)
    >>> parse("auto:int8,fp16"), parse("auto:powersgd:2")
    (('none', 'fp16', 'int8'), ('none', 'powersgd:2'))
    """
    head, colon, listed = compression.partition(":")
    if head != "auto":
        return None
    if not colon:
        return CANDIDATES
    names = [name.strip() for name in listed.split(",")]
    for name in names:
        try:
            parse_method(name)
        except ValueError:
            raise ValueError(f"compression {compression!r}: {name!r} is not a method; after 'auto:' list some of: "
                             f"{', '.join(method_names())}") from None
    chosen = set(names) | {"none"}
    return tuple(sorted(chosen, key=lambda name: _LOSSINESS.index(parse_method(name)[0])))
MARGIN = 0.2          # compress only if it cuts the predicted wait by 20 % ...
MIN_SAVING_S = 0.5e-3  # ... and by at least half a millisecond
DRIFT_FACTOR = 2.0     # the wait at the end of backward moved by this factor since the decision settled ...
DRIFT_MIN_S = 5e-3     # ... and by this much: the link or the load changed (:func:`drifted`)


@dataclass(frozen=True)
class Network:
    """One link as the model sees it: seconds per collective call, and bytes per second on the wire."""

    latency_s: float
    bandwidth: float


@dataclass(frozen=True)
class Bucket:
    """A bucket as the model sees it: backward time left after it was ready, and per method its cost."""

    lead_s: float
    wire_bytes: dict          # method -> bytes this rank sends
    collectives: dict         # method -> collective calls
    compute_s: dict           # method -> seconds of codec arithmetic
    link_scale: dict = field(default_factory=dict)  # method -> its measured chain's link time over the model's


def link_scale(chain_s: float, compute_s: float, latency_s: float, collectives: int, wire_bytes: float,
               bandwidth: float) -> float:
    """How much longer than ``latency · collectives + bytes / bandwidth`` a method holds the link, from its whole
    chain timed on one bucket (its codec arithmetic taken out): the start before the first byte, the gaps
    between pieces and phases. 1 when the chain is no slower than the model (or was not timed).

    >>> round(link_scale(0.017, 0.0025, 1e-4, 2, 1.45e6, 125e6), 2)   # int8's 1.45 M values at 1 Gbit/s
    1.23
    """
    modelled = latency_s * collectives + wire_bytes / bandwidth
    if math.isnan(chain_s) or modelled <= 0:  # NaN: not timed
        return 1.0
    return min(max((chain_s - compute_s) / modelled, 1.0), 10.0)


def exposed_seconds(buckets: list[Bucket], methods: list[str], network: Network, codec_on_cores: bool) -> float:
    """Predicted time a step loses to communication with ``methods[b]`` for bucket b (:mod:`gpurig.perf.overlap`).

    >>> net = Network(latency_s=0.0, bandwidth=1e9)
    >>> b = Bucket(lead_s=0.002, wire_bytes={"none": 4e6}, collectives={"none": 1}, compute_s={"none": 0.0})
    >>> round(exposed_seconds([b], ["none"], net, codec_on_cores=True), 6)   # 4 ms of wire, 2 ms hidden
    0.002
    """
    return overlap.exposed_seconds(
        [b.lead_s for b in buckets],
        [b.link_scale.get(m, 1.0) * (network.latency_s * b.collectives[m] + b.wire_bytes[m] / network.bandwidth)
         for b, m in zip(buckets, methods)],
        [b.compute_s[m] for b, m in zip(buckets, methods)], codec_on_cores)


def fit_bandwidth(buckets: list[Bucket], methods: list[str], latency_s: float, measured_s: float,
                  codec_on_cores: bool) -> float:
    """The bandwidth (bytes/s) under which ``methods`` would make backward wait ``measured_s``.

    When nothing was waited for, the smallest bandwidth that explains that
    (so a run that is fine as it is stays as it is).

    >>> b = Bucket(lead_s=0.0, wire_bytes={"none": 1e6}, collectives={"none": 1}, compute_s={"none": 0.0})
    >>> round(fit_bandwidth([b], ["none"], 0.0, 0.008, True) / 1e6)   # 1 MB in 8 ms
    125
    """
    low, high = 1e3, 1e13
    for _ in range(100):  # bisection on a log scale; the wait falls as bandwidth grows
        middle = (low * high) ** 0.5
        if exposed_seconds(buckets, methods, Network(latency_s, middle), codec_on_cores) > measured_s:
            low = middle
        else:
            high = middle
    return high


def choose(buckets: list[Bucket], network: Network, codec_on_cores: bool,
           candidates: tuple[str, ...] = CANDIDATES) -> tuple[list[str], dict]:
    """Per bucket, the method for the coming steps; also the predictions behind the choice.

    First the fastest assignment (local search: change one bucket at a time
    while that shortens the predicted step); then, from the first bucket to
    leave, each one goes back to the least lossy method that keeps the
    predicted wait within the margin — a bucket hidden under backward anyway
    stays uncompressed.

    >>> net = Network(latency_s=1e-4, bandwidth=125e6)        # 1 Gbit/s
    >>> big = Bucket(0.0, {"none": 9.6e6, "int8": 2.4e6}, {"none": 1, "int8": 2}, {"none": 0.0, "int8": 0.004})
    >>> early = Bucket(0.05, {"none": 1e6, "int8": 2.5e5}, {"none": 1, "int8": 2}, {"none": 0.0, "int8": 0.001})
    >>> choose([early, big], net, codec_on_cores=True, candidates=("none", "int8"))[0]
    ['none', 'int8']
    """
    usable = [[m for m in candidates if m in b.wire_bytes] for b in buckets]

    def cost(methods):
        return exposed_seconds(buckets, methods, network, codec_on_cores)

    plain = cost(["none"] * len(buckets))
    fastest = ["none"] * len(buckets)
    for _ in range(10):
        changed = False
        for b, options in enumerate(usable):
            trials = [fastest[:b] + [m] + fastest[b + 1:] for m in options]
            better = min(trials, key=cost)  # ties go to the least lossy (first) option
            if cost(better) < cost(fastest) - 1e-9:
                fastest, changed = better, True
        if not changed:
            break
    best = cost(fastest)
    predictions = {"none_ms": 1000 * plain, "fastest_ms": 1000 * best}
    if plain - best < max(MARGIN * plain, MIN_SAVING_S):
        return ["none"] * len(buckets), {**predictions, "chosen_ms": 1000 * plain}
    # To lose less precision, give back at most a tenth of the saving, and no more than a tenth of what is left
    # (or half a millisecond): behind 100 Mbit/s a tenth of the saving would be int8's 80 ms for PowerSGD's 7.
    allowed = best + min(0.1 * (plain - best), max(0.1 * best, MIN_SAVING_S))
    methods = list(fastest)
    for b, options in enumerate(usable):
        for method in options:  # least lossy first
            if method == methods[b]:
                break
            trial = methods[:b] + [method] + methods[b + 1:]
            if cost(trial) <= allowed:
                methods = trial
                break
    return methods, {**predictions, "chosen_ms": 1000 * cost(methods)}


def shortlist(buckets: list[Bucket], network: Network, codec_on_cores: bool, chosen: list[str],
              candidates: tuple[str, ...] = CANDIDATES, most: int = 3, within: float = 1.5) -> list[list[str]]:
    """The assignments worth timing in real steps before settling: ``chosen`` first, then each method on every
    bucket that can take it (the others keep ``chosen``'s), fastest predicted first, while the predicted wait
    is within ``within`` times the fastest's (plus :data:`MIN_SAVING_S`); at most ``most``. Only ``chosen``
    when it compresses nothing: the model saw nothing to gain.

    The model ranks; the steps decide. On a CPU a codec and backward share the
    cores, and how a method's traffic mixes with backward is measured, not modelled.

    >>> net = Network(latency_s=1e-4, bandwidth=125e6)        # 1 Gbit/s
    >>> big = Bucket(0.0, {"none": 9.6e6, "int8": 2.4e6}, {"none": 1, "int8": 2}, {"none": 0.0, "int8": 0.004})
    >>> shortlist([big], net, True, ["int8"], ("none", "int8"))   # none: 77 ms predicted, int8 24 ms
    [['int8']]
    >>> shortlist([big], Network(1e-4, 1.25e9), True, ["int8"], ("none", "int8"))   # 10 Gbit/s: 7.8 vs 6.3 ms
    [['int8'], ['none']]
    """
    if all(method == "none" for method in chosen):
        return [chosen]

    def cost(methods):
        return exposed_seconds(buckets, methods, network, codec_on_cores)

    uniform = [[m if m in b.wire_bytes else c for b, c in zip(buckets, chosen)] for m in candidates]
    fastest = min(cost(methods) for methods in uniform + [chosen])
    listed = [chosen]
    for methods in sorted(uniform, key=cost):
        if methods not in listed and cost(methods) <= within * fastest + MIN_SAVING_S:
            listed.append(methods)
    return listed[:most]


def drifted(settled_s: float, recent_s: float, factor: float = DRIFT_FACTOR, least_s: float = DRIFT_MIN_S) -> bool:
    """Whether the wait at the end of backward moved far enough from ``settled_s`` (measured once the last
    decision settled) to ``recent_s`` (the last steps') that the link or the load has changed: by
    ``factor`` either way *and* by ``least_s``, so a few milliseconds of noise on a short wait do not count.

    DataParallel decides again only when this holds at two reviews in a row (one noisy window does not make
    it flap), and reviews less often each time a new decision changes nothing.

    >>> drifted(0.024, 0.030), drifted(0.024, 0.120), drifted(0.024, 0.005)   # int8 behind 1 Gbit/s; slower; faster
    (False, True, True)
    >>> drifted(0.0037, 0.0017)   # half, but two milliseconds: noise on this machine
    False
    """
    return abs(recent_s - settled_s) >= least_s and (recent_s > factor * settled_s or recent_s * factor < settled_s)
