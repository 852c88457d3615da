"""How much gradient communication hides under the backward pass: buckets on one link, in order.

Bucket b is ready ``lead[b]`` seconds before backward ends (the backward time
still to run after its last gradient is computed) and then takes
``transfer[b]`` seconds on the link; buckets travel one after another (one
communication stream, as DDP, Horovod and gpurig do). Whatever is still
travelling when backward ends is *exposed*: the step waits for it. Codec
arithmetic (compression) either runs on the cores that compute — a CPU rank,
where it lengthens the step whatever overlaps — or in the communication
pipeline (a GPU stream).
"""

from __future__ import annotations


def exposed_seconds(lead_s: list[float], transfer_s: list[float], codec_s: list[float] | None = None,
                    codec_on_cores: bool = True) -> float:
    """Seconds the step waits for communication after the end of backward.

    >>> exposed_seconds([0.010, 0.0], [0.004, 0.004])   # the first hides, the second is all exposed
    0.004
    >>> exposed_seconds([0.010, 0.0], [0.015, 0.004])   # the first runs 5 ms past the end, the second queues
    0.009
    >>> round(exposed_seconds([0.0], [0.004], [0.001], codec_on_cores=True), 6)
    0.005
    """
    return timeline(lead_s, transfer_s, codec_s, codec_on_cores)[0]


def timeline(lead_s: list[float], transfer_s: list[float], codec_s: list[float] | None = None,
             codec_on_cores: bool = True, slowdown: float = 1.0,
             posted_s: list[float] | None = None) -> tuple[float, float]:
    """(seconds the step waits after backward, seconds backward is stretched by communicating under it).

    ``slowdown``: how much slower backward computes while a bucket is in flight
    (``gpurig bench`` measures it: on a CPU rank the communication thread shares
    the cores; on a GPU, the collective's kernels share the SMs). Backward's
    work is followed in wall-clock time: a bucket leaves once backward has done
    its share of work and the link is free, and while one travels backward
    advances at 1/``slowdown`` speed. The work itself is ``sum`` of the
    backward, so the leads are in work-seconds. ``posted_s``: what posting each
    bucket costs backward when it still has work to do (bench measures that
    too: waking the thread that runs the bucket's collectives, on cores the
    computation fills); a bucket posted as backward ends costs nothing, as the
    rank then only waits.

    >>> timeline([0.010, 0.0], [0.004, 0.004])                  # no slowdown: as exposed_seconds
    (0.004, 0.0)
    >>> [round(x, 6) for x in timeline([0.010, 0.0], [0.004, 0.004], slowdown=2.0)]   # 4 ms at half speed
    [0.004, 0.002]
    >>> [round(x, 6) for x in timeline([0.010, 0.0], [0.004, 0.004], posted_s=[0.003, 0.003])]  # the first is early
    [0.004, 0.003]
    """
    codec_s = codec_s or [0.0] * len(lead_s)
    posted = posted_s or [0.0] * len(lead_s)
    total = max(lead_s, default=0.0)  # backward work still to do when the first bucket is ready, at the least
    clock, done = 0.0, 0.0             # wall time and backward work since the first bucket was ready
    link_free, on_cores = float("-inf"), 0.0

    def advance(work: float) -> None:  # run ``work`` seconds of backward from ``clock``
        nonlocal clock, done
        busy = max(0.0, min(link_free - clock, work * slowdown))  # wall time spent beside a transfer
        clock += busy + (work - busy / slowdown)
        done += work

    for lead, transfer, codec, cost in zip(lead_s, transfer_s, codec_s, posted):
        if codec_on_cores:
            on_cores += codec
        else:
            transfer += codec
        advance(max(0.0, (total - lead) - done))
        if total - done > 1e-12:
            clock += cost
        link_free = max(clock, link_free) + transfer
    advance(total - done)
    return max(0.0, link_free - clock) + on_cores, clock - total


def bucket_leads(backward_s: list[float], bucket_of_layer: list[int], buckets: int) -> list[float]:
    """Each bucket's lead: backward time left after its last layer's gradient is done.

    ``backward_s`` are the layers' backward times in the order backward runs
    them (last layer first); ``bucket_of_layer`` the bucket each belongs to.

    >>> bucket_leads([1.0, 2.0, 3.0], [0, 0, 1], 2)    # bucket 0 ready after 3 s of 6, bucket 1 at the end
    [3.0, 0.0]
    """
    total = sum(backward_s)
    done, ready_at = 0.0, [0.0] * buckets
    for seconds, bucket in zip(backward_s, bucket_of_layer):
        done += seconds
        ready_at[bucket] = max(ready_at[bucket], done)
    return [total - t for t in ready_at]
