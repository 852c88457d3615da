"""Ranks that disagree: every kind of collective mismatch, and NaN gradients, on the engine under test.

Rank 1 is the odd one out. Every case must raise on *every* rank, with a message
that says which ranks differ and how, and leave the job usable: a correct
collective right after it must work.
"""

import warnings

import torch

import gpurig
from casekit import case, write
from gpurig.comm import CollectiveMismatchError
from gpurig.parallel import NonFiniteGradientError, NonFiniteGradientWarning

comm = gpurig.init()
R, P = comm.rank, comm.size
ODD = 1
odd = R == ODD


def still_usable():
    t = torch.ones(3)
    comm.allreduce(t, op="sum", name="after")
    assert t.tolist() == [P] * 3, t


def mismatch(fn, *needles):
    try:
        fn()
    except CollectiveMismatchError as error:
        text = str(error)
        for needle in needles:
            assert needle in text, (needle, text)
        still_usable()
        return text
    raise AssertionError("no CollectiveMismatchError")


@case("name")
def _():
    mismatch(lambda: comm.allreduce(torch.ones(4), name="b" if odd else "a"),
             "ranks 0, 2 submitted allreduce 'a' float32[4] average; rank 1 allreduce 'b' float32[4] average",
             "the name differs")


@case("shape: a different size (the engines would crash)")
def _():
    mismatch(lambda: comm.allreduce(torch.ones(100_001 if odd else 100_000), op="sum", name="g"),
             "rank 1 allreduce 'g' float32[100001] sum", "the shape differs")


@case("shape: both seen before (the blocking allreduce's short path)")
def _():
    small, large = torch.ones(1000), torch.ones(1001)
    for tensor in (small, large, small, large):  # every rank has now called both twice: each call is short
        comm.allreduce(tensor, op="sum", name="seen")
    mismatch(lambda: comm.allreduce(large if odd else small, op="sum", name="seen"),
             "rank 1 allreduce 'seen' float32[1001] sum", "the shape differs")


@case("shape: the same size")
def _():
    mismatch(lambda: comm.allreduce(torch.ones(3, 2) if odd else torch.ones(2, 3), name="g"),
             "float32[2,3]", "rank 1 allreduce 'g' float32[3,2]", "the shape differs")


@case("dtype")
def _():
    mismatch(lambda: comm.allreduce(torch.ones(4, dtype=torch.float64 if odd else torch.float32), name="g"),
             "rank 1 allreduce 'g' float64[4]", "the dtype differs")


@case("reduction")
def _():
    mismatch(lambda: comm.allreduce(torch.ones(4), op="average" if odd else "sum", name="g"),
             "rank 1 allreduce 'g' float32[4] average", "the reduction or root differs")


@case("order")
def _():
    def both():
        for name in (("b", "a") if odd else ("a", "b")):
            comm.allreduce(torch.ones(4), name=name)

    mismatch(both, "rank 1 allreduce 'b'", "other tensors, or the same ones in another order")


@case("collective")
def _():
    mismatch(lambda: comm.allgather(torch.ones(4), name="g") if odd else comm.allreduce(torch.ones(4), name="g"),
             "rank 1 allgather 'g' float32[*]", "a different collective")


@case("broadcast root")
def _():
    mismatch(lambda: comm.broadcast(torch.ones(4), root=2 if odd else 0, name="w"),
             "rank 1 broadcast 'w' float32[4] from 2", "reduction or root differs")


@case("async")
def _():
    mismatch(lambda: comm.allreduce_async(torch.ones(5 if odd else 4), name="g").wait(), "the shape differs")


@case("not a mismatch: uneven allgather")
def _():
    out = comm.allgather(torch.full((R + 1, 2), float(R)), name="rows")
    assert out.shape == (sum(r + 1 for r in range(P)), 2)
    still_usable()


@case("DataParallel: different bucket layouts")
def _():
    torch.manual_seed(0)
    model = gpurig.DataParallel(torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Linear(64, 4)),
                                bucket_cap_mb=0.0001 if odd else 25)
    model.remove_hooks()  # hooks stay out of later cases
    mismatch(lambda: gpurig.DataParallel(model.module, bucket_cap_mb=0.0001 if odd else 25)(torch.ones(2, 8))
             .sum().backward(), "differs across ranks", "bucket")


@case("DataParallel: a rank calls another collective where the others begin backward")
def _():
    """The others' check of the step leaves at backward's first gradient, nonblocking; it meets the odd rank's
    check of its own collective, and every rank raises before any data moves."""
    torch.manual_seed(0)
    model = gpurig.DataParallel(torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Linear(64, 4)))

    def step():
        if odd:
            comm.allreduce(torch.ones(100_001), op="sum", name="extra")
        model(torch.ones(2, 8)).sum().backward()

    try:
        mismatch(step, "differs across ranks", "rank 1 allreduce 'extra' float32[100001] sum", "bucket 0")
    finally:
        model.remove_hooks()


@case("DataParallel: a rank calls another collective between forward and backward")
def _():
    """The step's check is posted after the last point where user code may begin a collective of its own (a
    loss allreduced on one rank only): a check posted in forward would agree on every rank, the others would
    then move bucket 0's data while the odd rank sends another tensor (a hang, or Gloo's abort)."""
    torch.manual_seed(0)
    model = gpurig.DataParallel(torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Linear(64, 4)))

    def step():
        loss = model(torch.ones(2, 8)).sum()
        if odd:
            comm.allreduce(torch.ones(100_001), op="sum", name="extra")
        loss.backward()

    try:
        mismatch(step, "differs across ranks", "rank 1 allreduce 'extra' float32[100001] sum", "bucket 0")
    finally:
        model.remove_hooks()


class CheckedAfterTheAverage(gpurig.DataParallel):
    """The guard as it runs on a GPU: no flag rides in the buckets; one sum per averaged bucket is checked."""
    flag_devices = ()


def nan_model(nonfinite, kind=gpurig.DataParallel):
    """A model whose last bias gets a NaN gradient on rank 1 only, while ``poison`` is set; the average carries
    it to every rank."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    poison = [True]
    if odd:
        net[2].bias.register_hook(lambda grad: torch.full_like(grad, float("nan")) if poison[0] else grad)
    model = kind(net, nonfinite=nonfinite)
    assert all(b.flagged == (kind is gpurig.DataParallel) for b in model.buckets)
    return model, poison


def stops(kind):
    model, _ = nan_model("stop", kind)
    try:
        model(torch.ones(2, 4)).sum().backward()
    except NonFiniteGradientError as error:
        assert "'2.bias' holds NaN" in str(error), error
    else:
        raise AssertionError("no NonFiniteGradientError")
    model.remove_hooks()
    still_usable()


def skips(kind):
    model, poison = nan_model("skip", kind)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = [p.detach().clone() for p in model.parameters()]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(torch.ones(2, 4)).sum().backward()
    assert not model.finite and model.stats.skipped_steps == 1
    assert any(issubclass(w.category, NonFiniteGradientWarning) and "'2.bias'" in str(w.message) for w in caught)
    optimizer.step()  # no gradients: the weights stay
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
    poison[0] = False
    model(torch.ones(2, 4)).sum().backward()
    assert model.finite and model.step(optimizer)
    assert not all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
    model.remove_hooks()


for kind, how in ((gpurig.DataParallel, "flagged in the buckets"), (CheckedAfterTheAverage, "checked after the average")):
    case(f"NaN gradient: stop ({how})")(lambda kind=kind: stops(kind))
    case(f"NaN gradient: skip ({how})")(lambda kind=kind: skips(kind))


write(R)
