"""DataParallel on N ranks against plain single-process training on the whole global batch.

Every rank computes the 1-rank reference itself (plain torch, no communication)
and compares. Tolerance: float32 reduction order differs between one big batch
and averaged per-rank means, so weights agree to 1e-5 relative / 1e-6 absolute.
"""

import warnings

import torch
import torch.nn.functional as F

import gpurig
from casekit import case, write
from gpurig.parallel.compression import wire_bytes

comm = gpurig.init()
R, P = comm.rank, comm.size
GLOBAL = 24 * P  # divides evenly, so per-rank means average to the global mean
RTOL, ATOL = 1e-5, 1e-6


def mlp(seed, hidden=64):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                               torch.nn.ReLU(), torch.nn.Linear(hidden, 5))


def data(steps):
    g = torch.Generator().manual_seed(1234)
    return [(torch.randn(GLOBAL, 20, generator=g), torch.randint(0, 5, (GLOBAL,), generator=g)) for _ in range(steps)]


def train_reference(model, make_opt, batches):
    opt = make_opt(model.parameters())
    for x, y in batches:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def train_parallel(model, make_opt, batches, **kw):
    dp = gpurig.DataParallel(model, **kw)
    opt = make_opt(dp.parameters())
    for x, y in batches:
        mine = torch.tensor_split(x, P)[R], torch.tensor_split(y, P)[R]
        opt.zero_grad()
        F.cross_entropy(dp(mine[0]), mine[1]).backward()
        opt.step()
    return dp


def assert_same_weights(a, b):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(p, q, rtol=RTOL, atol=ATOL), f"{name}: max diff {(p - q).abs().max().item():.3g}"


OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2),
}
for opt_name, make_opt in OPTIMIZERS.items():
    for cap_mb in (25.0, 0.001):  # one bucket, or many small ones
        @case(f"equivalence[{opt_name}-bucket{cap_mb}MB]")
        def _():
            batches = data(6)
            reference = train_reference(mlp(0), make_opt, batches)
            # Every rank starts from different weights: DataParallel must take rank 0's.
            dp = train_parallel(mlp(R), make_opt, batches, bucket_cap_mb=cap_mb)
            assert_same_weights(dp.module, reference)
            if cap_mb < 1:
                assert len(dp.buckets) >= 3
                assert dp.stats.launched_in_backward > 0, "no bucket was sent while backward was still running"


@case("prepared_bucket_allreduces_follow_the_layout")
def _():
    # Each bucket's allreduce is worked out once (Communicator.prepare_allreduce) and begun at every step; a new
    # flat (ZeRO, or here by hand) must give it a new one, and the step's one check must still cover it.
    batches = data(6)
    reference = train_reference(mlp(0), OPTIMIZERS["sgd_momentum"], batches)
    dp = gpurig.DataParallel(mlp(R), bucket_cap_mb=0.001)
    opt = OPTIMIZERS["sgd_momentum"](dp.parameters())
    for step, (x, y) in enumerate(batches):
        if step == 3:
            before = [b.plain_launch for b in dp.buckets]
            for bucket in dp.buckets:  # same values, new storage: p.grad must follow it too
                bucket.flat = bucket.flat.clone()
        mine = torch.tensor_split(x, P)[R], torch.tensor_split(y, P)[R]
        opt.zero_grad()
        F.cross_entropy(dp(mine[0]), mine[1]).backward()
        opt.step()
        if P == 1:
            continue
        seq = comm.guard.progress.seq
        for bucket, announced in zip(dp.buckets, dp._signatures()):
            known = bucket.plain_launch
            assert known.tensor is bucket.travelling and known.tensor.data_ptr() == bucket.flat.data_ptr()
            assert known.prepared is not None and known.prepared.signature == announced
        if step == 3:
            assert all(b.plain_launch is not old for b, old in zip(dp.buckets, before))
        if step > 0:  # the step's collectives: one check (numbered, not a collective of its own) and the buckets
            assert seq - last_seq == len(dp.buckets), (seq, last_seq)
        last_seq = seq
    assert len(dp.buckets) >= 3
    assert dp.stats.bytes_sent == 6 * sum(wire_bytes("none", b.shapes, P) for b in dp.buckets)
    assert_same_weights(dp.module, reference)


@case("broadcast_from_rank0_on_wrap")
def _():
    dp = gpurig.DataParallel(mlp(100 + R))
    ref = mlp(100)
    assert_same_weights(dp.module, ref)


@case("no_sync_accumulation")
def _():
    (x1, y1), (x2, y2) = data(2)
    reference = mlp(0)
    (F.cross_entropy(reference(x1), y1) + F.cross_entropy(reference(x2), y2)).backward()
    dp = gpurig.DataParallel(mlp(0))
    with dp.no_sync():
        F.cross_entropy(dp(torch.tensor_split(x1, P)[R]), torch.tensor_split(y1, P)[R]).backward()
    local_only = [p.grad.clone() for p in dp.parameters()]
    F.cross_entropy(dp(torch.tensor_split(x2, P)[R]), torch.tensor_split(y2, P)[R]).backward()
    for p, q in zip(dp.parameters(), reference.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=RTOL, atol=ATOL)
    if P > 1:  # inside no_sync the gradients were this rank's own
        assert any(not torch.allclose(a, p.grad) for a, p in zip(local_only, dp.parameters()))


@case("unused_parameters_do_not_hang")
def _():
    class TwoHeads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.body, self.used, self.unused = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.used(self.body(x))

    dp = gpurig.DataParallel(TwoHeads(), bucket_cap_mb=0.00001)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dp(torch.ones(3, 4) * (R + 1)).sum().backward()
    assert torch.equal(dp.module.unused.weight.grad, torch.zeros(2, 4))
    said = [str(w.message) for w in caught if "find_unused_parameters=True" in str(w.message)]
    assert P == 1 or len(said) == 1 and "'unused.weight'" in said[0] and "'unused.bias'" in said[0], said
    assert torch.allclose(dp.module.used.bias.grad, torch.full((2,), 3.0))  # 3 rows on every rank
    # body is linear, so the rank average of 3 * body(x_r) is 3 * body(mean x_r)
    mean_x = sum(r + 1 for r in range(P)) / P * torch.ones(1, 4)
    want = (3 * dp.module.body(mean_x)).detach().expand(2, 4)
    assert torch.allclose(dp.module.used.weight.grad, want, atol=1e-5), (dp.module.used.weight.grad, want)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dp(torch.ones(3, 4)).sum().backward()
    assert not caught, [str(w.message) for w in caught]  # said once


class Experts(torch.nn.Module):
    """Each sample goes to expert ``a`` or ``b`` by the sign of its first feature; ``c`` is never used. A rank
    whose samples all go to ``a`` gives ``b`` no gradient at all (it is not called)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.body = torch.nn.Linear(20, 16)
        self.a, self.b, self.c = torch.nn.Linear(16, 5), torch.nn.Linear(16, 5), torch.nn.Linear(16, 5)

    def forward(self, x):
        h, to_b = torch.relu(self.body(x)), x[:, 0] < 0
        out = self.a(h[~to_b])
        if to_b.any():
            out = torch.zeros(len(x), 5).index_put((~to_b).nonzero(as_tuple=True), out)
            out = out.index_put(to_b.nonzero(as_tuple=True), self.b(h[to_b]))
        return out


@case("find_unused_parameters_matches_one_process")
def _():
    # b is used only by rank 0's samples, c by none: with momentum and weight decay, torch leaves c alone
    batches = [(x.clone(), y) for x, y in data(6)]
    for x, _ in batches:
        x[:, 0] = x[:, 0].abs()
        x[1:3, 0] = -1.0  # rank 0's slice
    make_opt = lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01)
    reference = train_reference(Experts(), make_opt, batches)
    assert reference.c.weight.grad is None
    untouched = Experts().c.weight
    dp = train_parallel(Experts(), make_opt, batches, bucket_cap_mb=0.00001, find_unused_parameters=True)
    assert len(dp.buckets) >= 3
    assert dp.module.c.weight.grad is None and dp.module.b.weight.grad is not None
    assert torch.equal(dp.module.c.weight, untouched)
    assert_same_weights(dp.module, reference)
    # compressed buckets finish on the communication thread; the used parameters are agreed after them
    dp = train_parallel(Experts(), make_opt, batches[:2], compression="fp16", find_unused_parameters=True)
    assert dp.module.c.bias.grad is None and dp.module.b.bias.grad is not None
    try:
        gpurig.DataParallel(Experts(), shard="optimizer", find_unused_parameters=True)
    except ValueError as e:
        assert "shard" in str(e)
    else:
        raise AssertionError("find_unused_parameters with shard was accepted")


@case("batchnorm_buffers_follow_rank0")
def _():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.BatchNorm1d(6))
    dp = gpurig.DataParallel(model)
    dp(torch.randn(8, 6) + R)  # running stats diverge per rank ...
    model[1].num_batches_tracked.fill_(10 + R)  # (an int64 buffer: every dtype travels in one broadcast)
    dp(torch.randn(8, 6))      # ... and the next forward takes rank 0's before computing
    stats = comm.allgather(model[1].running_mean.view(1, -1).clone())
    assert torch.allclose(stats, stats[0].expand_as(stats)) or P == 1
    assert int(model[1].num_batches_tracked) == 11, model[1].num_batches_tracked
    if R == 0:  # rank 0 alone evaluates under no_grad: nothing to sync, as in DDP (the others would not join)
        with torch.no_grad():
            dp.eval()(torch.randn(8, 6))
    comm.barrier()


@case("mismatched_models_name_first_difference")
def _():
    hidden = 64 if R == 0 else 32
    try:
        gpurig.DataParallel(mlp(0, hidden=hidden))
    except gpurig.ModelMismatchError as e:
        assert P > 1 and "'0.weight'" in str(e) and "rank 0 has shape [64, 20]" in str(e), str(e)
        assert "rank 1 has shape [32, 20]" in str(e), str(e)
    else:
        assert P == 1, "no error for different models"


@case("refuses_what_it_cannot_average")
def _():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    model[R % 2].weight.requires_grad_(False)  # ranks freezing different parameters of the same shape
    try:
        gpurig.DataParallel(model)
    except gpurig.ModelMismatchError as e:
        assert P > 1 and "param '0.weight': requires_grad is False on rank 0, True on rank 1" in str(e), str(e)
    else:
        assert P == 1, "ranks training different parameters were averaged together"
    for nothing in (torch.nn.ReLU(), torch.nn.Linear(2, 2).requires_grad_(False)):
        try:
            gpurig.DataParallel(nothing)
        except ValueError as e:
            assert "no parameter that requires a gradient" in str(e), e
        else:
            raise AssertionError("a model with nothing to train was wrapped")
    try:
        gpurig.DataParallel(torch.nn.Sequential(torch.nn.Embedding(10, 4, sparse=True)))
    except ValueError as e:
        assert "'0' makes sparse gradients" in str(e), e
    else:
        raise AssertionError("sparse gradients were accepted")
    weight = torch.nn.Parameter(torch.ones(2))
    try:
        comm.allreduce(weight)
    except TypeError as e:
        assert "requires grad" in str(e) and torch.equal(weight.detach(), torch.ones(2)), e
    else:
        raise AssertionError("an allreduce into a tensor that requires grad was begun")
    with torch.no_grad():
        comm.allreduce(weight, op="sum")   # as an optimizer would: allowed
    assert torch.equal(weight.detach(), torch.full((2,), float(P)))


@case("freezing_or_unfreezing_after_wrapping_is_refused_and_wrapping_again_works")
def _():
    torch.manual_seed(0)
    for frozen_first in (True, False):
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        model[0].weight.requires_grad_(not frozen_first)
        dp = gpurig.DataParallel(model)
        model[0].weight.requires_grad_(frozen_first)   # gradual unfreezing, or freezing a layer mid-run
        try:
            dp(torch.ones(3, 4))
        except ValueError as e:
            assert "'0.weight' was " + ("unfrozen" if frozen_first else "frozen") in str(e), e
        else:
            raise AssertionError("a parameter that changed requires_grad after wrapping was not noticed")
        dp.remove_hooks()
        dp = gpurig.DataParallel(dp.module)                # as the message says
        dp(torch.full((3, 4), float(R))).sum().backward()
        assert (model[0].weight.grad is not None) == frozen_first
        if frozen_first:   # averaged now: every rank holds the mean of the ranks' gradients
            mean = comm.allreduce(model[0].weight.grad.clone(), op="sum", name="check") / P
            assert torch.allclose(model[0].weight.grad, mean)
        dp.remove_hooks()
    with torch.no_grad():   # an evaluation may freeze what it likes
        model[1].weight.requires_grad_(False)
        dp = gpurig.DataParallel(torch.nn.Linear(4, 2))
        dp.module.weight.requires_grad_(False)
        dp(torch.ones(1, 4))
        dp.remove_hooks()


@case("bad_arguments_are_one_clear_error")
def _():
    for cap in (float("nan"), float("inf"), 0, -1):
        try:
            gpurig.DataParallel(torch.nn.Linear(2, 2), bucket_cap_mb=cap)
        except ValueError as e:
            assert "bucket_cap_mb must be a positive, finite number" in str(e), e
        else:
            raise AssertionError(f"bucket_cap_mb={cap} accepted")
    dp = gpurig.DataParallel(torch.nn.Linear(2, 2), compression=None)   # as Horovod's Compression.none
    assert dp.compression == "none" and dp.methods == ["none"]
    dp.remove_hooks()


@case("mixed_precision_without_a_communicator_skips_on_every_rank_together")
def _():
    """The docs' recipe, MixedPrecision("fp16") without comm=: an overflow on one rank skips the step on all."""
    torch.manual_seed(0)
    mixed = gpurig.MixedPrecision("fp16")
    model = gpurig.DataParallel(torch.nn.Linear(4, 2), nonfinite="ignore")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.module.weight.detach().clone()
    with mixed.autocast():
        loss = model(torch.ones(8, 4)).float().mean()
    mixed.scale(loss).backward()
    if R == P - 1:
        model.module.weight.grad[0, 0] = float("inf")   # this rank's own, after averaging: no rank saw it there
    assert mixed.step(opt, model) is False and mixed.scale_value == 32768.0
    assert torch.equal(model.module.weight.detach(), before)
    model.remove_hooks()


@case("mismatched_layer_names")
def _():
    model = mlp(0)
    if R == P - 1:
        model.add_module("extra", torch.nn.Linear(2, 2))
    try:
        gpurig.DataParallel(model)
    except gpurig.ModelMismatchError as e:
        assert "extra.weight" in str(e), str(e)
    else:
        assert P == 1


@case("float64_model_matches_and_its_buckets_are_the_ones_announced")
def _():
    """A float64 model's buckets travel as float64, and the step's announced collectives say so: each bucket's
    allreduce is the one the guard checked with the step's batch (announced as float32 before, every bucket
    ended the batch and was checked again on its own)."""
    batches = [(x.double(), y) for x, y in data(3)]
    ref = train_reference(mlp(5).double(), OPTIMIZERS["sgd_momentum"], batches)
    guard = comm.guard
    begin, announced = guard.begin, []

    def seen(signature, nbytes, check=True):
        if (signature.name or "").startswith("bucket"):
            if guard._posted is not None:   # what begin does first: judge the step's check posted in backward
                guard.settle()
            announced.append(bool(guard._expected) and guard._expected[0] == signature)
        return begin(signature, nbytes, check)
    guard.begin = seen
    try:
        dp = train_parallel(mlp(5).double(), OPTIMIZERS["sgd_momentum"], batches, bucket_cap_mb=0.01)
    finally:
        del guard.begin
    assert_same_weights(dp, ref)
    assert len(dp.buckets) > 1 and all(b.flat.dtype == torch.float64 for b in dp.buckets)
    assert len(announced) == 3 * len(dp.buckets) and all(announced), announced


@case("shard_covers_global_batch_disjointly")
def _():
    n = 10 * GLOBAL + 5
    ids = torch.arange(n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batches = gpurig.shard((ids, ids * 2), global_batch=GLOBAL, seed=7)
    for epoch in range(2):
        batches.set_epoch(epoch)
        seen = []
        for mine, doubled in batches:
            assert mine.numel() == GLOBAL // P and torch.equal(doubled, mine * 2)
            everyone = comm.allgather(mine)
            assert torch.equal(everyone.sort().values, everyone.unique()), "ranks overlap"
            seen.append(everyone)
        order = batches.order()
        assert torch.equal(torch.cat(seen), order[: len(batches) * GLOBAL])
    batches.set_epoch(0)
    first = next(iter(batches))[0]
    batches.set_epoch(1)
    assert not torch.equal(first, next(iter(batches))[0])


@case("shard_of_a_dataloader_slices_each_batch")
def _():
    dataset = torch.utils.data.TensorDataset(torch.arange(100).float())
    loader = torch.utils.data.DataLoader(dataset, batch_size=GLOBAL, shuffle=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parts = [b[0] for b in gpurig.shard(loader)]
    glued = comm.allgather(torch.cat(parts))
    assert sorted(glued.tolist()) == [float(i) for i in range(100)]  # every sample once, the short last batch too


@case("shard_batches_samples_and_dicts_as_it_does_tensors")
def _():
    xs, ys = torch.arange(GLOBAL * 3 * 2.0).view(-1, 2), torch.arange(GLOBAL * 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = list(gpurig.shard((xs, ys), global_batch=GLOBAL, seed=5))
        pairs = list(gpurig.shard([(x, y) for x, y in zip(xs, ys)], global_batch=GLOBAL, seed=5))
        named = list(gpurig.shard({"x": xs, "y": ys}, global_batch=GLOBAL, seed=5))
    assert len(pairs) == len(named) == len(plain) == 3
    for (x, y), (px, py), d in zip(plain, pairs, named):
        assert torch.equal(x, px) and torch.equal(y, py) and torch.equal(x, d["x"]) and torch.equal(y, d["y"])
    try:  # a DataLoader makes its own batches
        gpurig.shard(torch.utils.data.DataLoader(xs, batch_size=4), global_batch=GLOBAL)
    except ValueError as e:
        assert "leave out global_batch" in str(e), e
    else:
        raise AssertionError("a DataLoader with global_batch= was accepted")
    # drop_last=False: the partial last batch is a batch where every rank gets a sample of it, and len() says so
    for extra, batches, said in ((P + 1, 2, "unevenly" if (P + 1) % P else None), (P - 1, 1, "left out")):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            part = gpurig.shard((torch.arange(GLOBAL + extra),), global_batch=GLOBAL, drop_last=False)
        assert len(part) == len(list(part)) == (batches if extra else 1), (extra, len(part))
        told = [str(w.message) for w in caught if issubclass(w.category, gpurig.BatchSizeWarning)]
        assert R > 0 or said is None or any(said in m for m in told), told


@case("tile_warning_on_rank0")
def _():
    """The posts' tile rule is a GPU's: told on rank 0 of a GPU machine, never on CPU ranks (each small run)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gpurig.shard((torch.zeros(256, 2),), global_batch=16 * P)
    got = [w for w in caught if issubclass(w.category, gpurig.BatchSizeWarning)]
    assert len(got) == (1 if R == 0 and torch.cuda.is_available() else 0), got


@case("shard_refuses_what_it_cannot_batch")
def _():
    for bad, error in (("notdata", TypeError), (torch.zeros(8), None), ([], ValueError), ((torch.zeros(10, 2),), ValueError)):
        try:
            gpurig.shard(bad, global_batch=11 if isinstance(bad, tuple) else 4)
        except (TypeError, ValueError) as e:
            assert error is not None and isinstance(e, error), (bad, e)
        else:
            assert error is None, bad   # a bare tensor is data


@case("uneven_split_warns_that_the_step_is_not_the_global_mean")
def _():
    if P == 1:
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gpurig.shard((torch.zeros(256, 2),), global_batch=64 * P + 1)
    got = [str(w.message) for w in caught if issubclass(w.category, gpurig.BatchSizeWarning)]
    assert len(got) == (1 if R == 0 else 0) and all("unevenly" in m for m in got), got


write(R)
