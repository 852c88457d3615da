"""``compression="auto"``: choose each bucket's method from what this run measured.

The decision is a small model of one backward pass, fed only with measurements:

- when each bucket leaves (how much backward is still to run after its
  gradients are ready: its *lead*), from the run's own steps;
- the network: the latency of one collective (a few tiny allreduces) and its
  bandwidth (the largest bucket allreduced on its own); the bandwidth that would
  explain the wait the steps measured at the end of backward
  (:func:`fit_bandwidth`) is kept beside it, to show how well the model fits;
- what each method costs on this device for each bucket (timed here).

Buckets travel one after another on one link: bucket b starts when it is ready
and the previous one is done, and takes ``latency · collectives + bytes / bandwidth``.
What sticks out past the end of backward is waited for. On a CPU the codec's
arithmetic runs on the cores that compute, so it adds to the step; on a GPU it
sits in the communication pipeline. :func:`choose` takes, per bucket, the least
lossy method whose predicted step is within a margin of the fastest assignment
— a bucket hidden under backward anyway stays uncompressed — and ``none``
everywhere unless compressing saves at least :data:`MARGIN` of the wait.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpurig.perf import overlap

# Least to most lossy. PowerSGD is not among them: its error is not bounded per value (a low-rank projection,
# repaid by error feedback over later steps), and how well it trains depends on its rank and on warm-up, so
# it stays a choice the user makes.
CANDIDATES = ("none", "fp16", "int8")
MARGIN = 0.2          # compress only if it cuts the predicted wait by 20 % ...
MIN_SAVING_S = 0.5e-3  # ... and by at least half a millisecond


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


def exposed_seconds(buckets: list[Bucket], methods: list[str], network: Network, codec_on_cores: bool) -> float:
    """Predicted time a step loses to communication with ``methods[b]`` for bucket b (:mod:`gpurig.perf.overlap`).

    >>> net = Network(latency_s=0.0, bandwidth=1e9)
    >>> b = Bucket(lead_s=0.002, wire_bytes={"none": 4e6}, collectives={"none": 1}, compute_s={"none": 0.0})
    >>> round(exposed_seconds([b], ["none"], net, codec_on_cores=True), 6)   # 4 ms of wire, 2 ms hidden
    0.002
    """
    return overlap.exposed_seconds(
        [b.lead_s for b in buckets],
        [network.latency_s * b.collectives[m] + b.wire_bytes[m] / network.bandwidth for b, m in zip(buckets, methods)],
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
    allowed = best + 0.1 * (plain - best)  # give back at most a tenth of the saving to lose less precision
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
