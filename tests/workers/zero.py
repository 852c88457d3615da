"""ZeRO on N ranks: DataParallel(shard="optimizer" | "gradients") with ZeroRedundancyOptimizer against unsharded
DataParallel and the 1-rank reference (plain torch on the whole global batch), to 1e-5; its whole-format state dict;
--accumulate and fp16 through train_step; compression; the agreed skip; the optimizer state it keeps per rank.
"""

import torch
import torch.nn.functional as F

import gpurig
from casekit import case, write
from gpurig.parallel import optimizer_state_bytes
from gpurig.parallel.mixed_precision import MixedPrecision
from gpurig.train.step import train_step

comm = gpurig.init()
R, P = comm.rank, comm.size
GLOBAL = 12 * P
RTOL, ATOL = 1e-5, 1e-6
STEPS = 4
BUCKET_MB = 0.002  # ~500 floats a bucket: several buckets, parameters cut by shard boundaries


def mlp(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, 33), torch.nn.ReLU(), torch.nn.Linear(33, 17), torch.nn.ReLU(),
                               torch.nn.Linear(17, 5))


def data(steps):
    g = torch.Generator().manual_seed(1234)
    return [(torch.randn(GLOBAL, 20, generator=g), torch.randint(0, 5, (GLOBAL,), generator=g)) for _ in range(steps)]


def adam(params):
    return torch.optim.Adam(params, lr=0.01, weight_decay=0.01)


def reference(batches, make=adam):
    """Plain torch, one process, each step on the whole global batch."""
    model = mlp(0)
    opt = make(model.parameters())
    for x, y in batches:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model, opt


def mine(x, y):
    return torch.tensor_split(x, P)[R], torch.tensor_split(y, P)[R]


def parallel(batches, shard, make=adam, accumulate=1, precision="fp32", compression="none"):
    """gpurig train's step on this rank's part of every batch (rank-dependent initial weights: broadcast fixes them)."""
    dp = gpurig.DataParallel(mlp(R), bucket_cap_mb=BUCKET_MB, shard=shard, compression=compression,
                             nonfinite="ignore" if precision == "fp16" else "stop")
    opt = make(dp.parameters())
    if shard != "none":
        opt = gpurig.ZeroRedundancyOptimizer(opt, dp)
    mixed = MixedPrecision(precision, comm)
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        assert train_step(dp, dp, opt, *mine(x, y), accumulate=accumulate, mixed=mixed).stepped
    return dp, opt


def assert_close(a, b, rtol=RTOL, atol=ATOL):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(p, q, rtol=rtol, atol=atol), f"{name}: max diff {(p - q).abs().max().item():.3g}"


def assert_same_everywhere(model):
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = comm.allgather(flat.view(1, -1))
    assert all(torch.equal(everyone[0], row) for row in everyone), "ranks hold different weights"


for shard in ("optimizer", "gradients"):
    @case(f"{shard}_adam_equals_unsharded_and_one_rank")
    def _(shard=shard):
        batches = data(STEPS)
        sharded, _ = parallel(batches, shard)
        plain, _ = parallel(batches, "none")
        assert len(sharded.buckets) >= 2
        assert_close(sharded.module, plain.module)
        assert_close(sharded.module, reference(batches)[0])
        assert_same_everywhere(sharded.module)
        # a reduce-scatter and an allgather put the bytes of the allreduce they replace on the wire
        assert abs(sharded.stats.bytes_sent - plain.stats.bytes_sent) <= 8 * len(sharded.buckets) * STEPS

    @case(f"{shard}_state_dict_is_the_whole_unsharded_one")
    def _(shard=shard):
        batches = data(STEPS)
        _, opt = parallel(batches, shard)
        _, ref = reference(batches)
        ours, theirs = opt.state_dict(), ref.state_dict()
        assert [g["params"] for g in ours["param_groups"]] == [g["params"] for g in theirs["param_groups"]]
        assert sorted(ours["state"]) == sorted(theirs["state"])
        for i, expected in theirs["state"].items():
            assert sorted(ours["state"][i]) == sorted(expected)
            for key, value in expected.items():
                assert torch.allclose(ours["state"][i][key], value, rtol=RTOL, atol=1e-7), (i, key)

    @case(f"{shard}_accumulate_2_fp16_equals_unsharded")
    def _(shard=shard):
        batches = data(STEPS)
        sharded, _ = parallel(batches, shard, accumulate=2, precision="fp16")
        plain, _ = parallel(batches, "none", accumulate=2, precision="fp16")
        assert_close(sharded.module, plain.module)

    @case(f"{shard}_keeps_a_shard_of_adam_state")
    def _(shard=shard):
        batches = data(1)
        _, sharded = parallel(batches, shard)
        _, plain = parallel(batches, "none")
        mine_bytes, whole = optimizer_state_bytes(sharded), optimizer_state_bytes(plain)
        assert mine_bytes <= 1.1 * whole / P + 64, (mine_bytes, whole, P)
        total = comm.allreduce(torch.tensor([float(mine_bytes)]), op="sum").item()
        assert total >= whole - 8 * sum(1 for _ in plain.state)  # nothing left out (step counters aside)


@case("gradients_keeps_no_whole_gradient")
def _():
    sharded, _ = parallel(data(1), "gradients")
    assert all(p.grad is None for p in sharded.parameters())
    assert all(b.flat.numel() == 0 for b in sharded.buckets)
    whole = sum(p.numel() for p in sharded.parameters())
    assert sum(s.numel() for s in sharded.zero.grad_shards) <= whole / P + P * len(sharded.buckets)


@case("resume_from_a_whole_state_dict_continues_as_unsharded")
def _():
    batches = data(2 * STEPS)
    ref, ref_opt = reference(batches[:STEPS], make=lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9))
    saved_model, saved_opt = ref.state_dict(), ref_opt.state_dict()  # a plain (any rank count) checkpoint
    net = mlp(R)
    net.load_state_dict(saved_model)
    dp = gpurig.DataParallel(net, bucket_cap_mb=BUCKET_MB, shard="gradients")
    opt = gpurig.ZeroRedundancyOptimizer(torch.optim.SGD(dp.parameters(), lr=0.05, momentum=0.9), dp)
    opt.load_state_dict(saved_opt)
    mixed = MixedPrecision("fp32", comm)
    for x, y in batches[STEPS:]:
        opt.zero_grad()
        train_step(dp, dp, opt, *mine(x, y), accumulate=1, mixed=mixed)
    for x, y in batches[STEPS:]:
        ref_opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        ref_opt.step()
    assert_close(dp.module, ref)


@case("param_groups_and_lr_scheduler")
def _():
    batches = data(STEPS)

    def two_groups(params):
        params = list(params)
        return torch.optim.AdamW([{"params": params[:3], "lr": 0.02}, {"params": params[3:]}], lr=0.005)

    def run(shard):
        dp = gpurig.DataParallel(mlp(R), bucket_cap_mb=BUCKET_MB, shard=shard)
        opt = two_groups(dp.parameters())
        if shard != "none":
            opt = gpurig.ZeroRedundancyOptimizer(opt, dp)
        schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        for x, y in batches:
            opt.zero_grad()
            F.cross_entropy(dp(mine(x, y)[0]), mine(x, y)[1]).backward()
            opt.step()
            schedule.step()
        return dp, opt

    sharded, opt = run("optimizer")
    plain, _ = run("none")
    assert_close(sharded.module, plain.module)
    assert [g["lr"] for g in opt.param_groups] == [0.02 * 0.5 ** STEPS, 0.005 * 0.5 ** STEPS]


for shard, codec in (("optimizer", "fp16"), ("gradients", "int8")):
    @case(f"{codec}_compression_{shard}_trains_alike")
    def _(shard=shard, codec=codec):
        batches = data(STEPS)

        def sgd(params):  # linear in the gradients: their codec error shows as it is (Adam would amplify tiny ones)
            return torch.optim.SGD(params, lr=0.1)

        sharded, _ = parallel(batches, shard, make=sgd, compression=codec)
        plain, _ = parallel(batches, "none", make=sgd)
        assert_same_everywhere(sharded.module)
        if P > 1:  # lossy, with error feedback: close to the exact run, not equal
            assert_close(sharded.module, plain.module, rtol=0.01, atol=1e-3)


@case("nan_on_one_rank_is_skipped_on_every_rank")
def _():
    dp = gpurig.DataParallel(mlp(0), bucket_cap_mb=BUCKET_MB, shard="optimizer", nonfinite="skip")
    opt = gpurig.ZeroRedundancyOptimizer(adam(dp.parameters()), dp)
    before = [p.detach().clone() for p in dp.parameters()]
    x, y = mine(*data(1)[0])
    if R == P - 1:
        x = x * float("nan")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        F.cross_entropy(dp(x), y).backward()
    assert not dp.finite
    dp.step(opt)
    assert all(torch.equal(a, b) for a, b in zip(before, dp.parameters()))
    assert not any(opt.state.values())  # the optimizer never stepped


@case("backward_without_a_wrapped_optimizer_says_so")
def _():
    dp = gpurig.DataParallel(mlp(0), shard="optimizer")
    try:
        dp(torch.ones(2, 20)).sum().backward()
    except RuntimeError as error:
        assert "ZeroRedundancyOptimizer" in str(error), error
    else:
        raise AssertionError("no error")


@case("a_frozen_layer_in_the_optimizer_is_left_alone_as_torch_does")
def _():
    """The docs' recipe on a fine-tuning model: the optimizer built on model.parameters(), one layer frozen."""
    torch.manual_seed(0)
    model = mlp(0)
    model[0].requires_grad_(False)
    frozen = model[0].weight.detach().clone()
    dp = gpurig.DataParallel(model, bucket_cap_mb=BUCKET_MB, shard="optimizer")
    opt = gpurig.ZeroRedundancyOptimizer(adam(dp.parameters()), dp)
    for x, y in data(2):
        opt.zero_grad()
        F.cross_entropy(dp(mine(x, y)[0]), mine(x, y)[1]).backward()
        opt.step()
    assert torch.equal(model[0].weight.detach(), frozen)
    state = opt.state_dict()      # the plain optimizer's format: the frozen ones indexed, without state
    assert len(state["param_groups"][0]["params"]) == len(list(model.parameters()))
    assert 0 not in state["state"] and 1 not in state["state"] and len(state["state"]) == 4, state["state"].keys()
    assert_same_everywhere(model)


@case("powersgd_cannot_be_sharded")
def _():
    try:
        gpurig.DataParallel(mlp(0), shard="gradients", compression="powersgd")
    except ValueError as error:
        assert "cannot be sharded" in str(error)
    else:
        raise AssertionError("no error")


@case("ranks_that_disagree_on_sharding_are_told_not_hung")
def _():
    if P == 1:
        return
    shard = "optimizer" if R == 0 else "none"  # rank 0 reduce-scatters where the others allreduce
    dp = gpurig.DataParallel(mlp(0), bucket_cap_mb=BUCKET_MB, shard=shard)
    opt = adam(dp.parameters())
    if shard != "none":
        opt = gpurig.ZeroRedundancyOptimizer(opt, dp)
    try:
        F.cross_entropy(dp(torch.ones(4, 20)), torch.zeros(4, dtype=torch.long)).backward()
    except gpurig.CollectiveMismatchError as error:
        assert "reduce_scatter" in str(error) and "allreduce" in str(error), error
    else:
        raise AssertionError("no error")


def reference_clipped(batches, max_norm, norm_type):
    """Plain torch on the whole global batch, ``clip_grad_norm_`` between backward and the step."""
    model = mlp(0)
    opt = adam(model.parameters())
    norms = []
    for x, y in batches:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, norm_type)))
        opt.step()
    return model, norms


for shard in ("none", "optimizer", "gradients"):
    for norm_type in (2.0, float("inf")):
        @case(f"clip_grad_norm_{shard}_{norm_type}_equals_torch_on_the_whole_batch")
        def _(shard=shard, norm_type=norm_type):
            batches, max_norm = data(STEPS), 0.01
            dp = gpurig.DataParallel(mlp(R), bucket_cap_mb=BUCKET_MB, shard=shard)
            opt = adam(dp.parameters())
            if shard != "none":
                opt = gpurig.ZeroRedundancyOptimizer(opt, dp)
            norms = []
            for x, y in batches:
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(dp(mine(x, y)[0]), mine(x, y)[1]).backward()
                norms.append(float(dp.clip_grad_norm_(max_norm, norm_type)))
                opt.step()
            model, expected = reference_clipped(batches, max_norm, norm_type)
            assert all(n > max_norm for n in expected), expected   # every step clipped: the test can fail
            assert all(abs(a - b) <= 1e-5 * b for a, b in zip(norms, expected)), (norms, expected)
            assert_close(dp.module, model)
            assert_same_everywhere(dp.module)


write(R)
