"""gpurig train's step on N ranks: --accumulate K against plain steps and the 1-rank reference; fp16's loss scaler
skipping the same steps on every rank when one rank alone overflows.

Every rank computes the 1-rank reference itself (plain torch on the whole global batch) and compares.
"""

import torch
import torch.nn.functional as F

import gpurig
from casekit import case, write
from gpurig.parallel.mixed_precision import MixedPrecision
from gpurig.train.step import train_step

comm = gpurig.init()
R, P = comm.rank, comm.size
GLOBAL = 12 * P  # each rank 12 samples: 2, 3 or 4 micro-batches of equal size
RTOL, ATOL = 1e-5, 1e-6
STEPS = 5


def mlp(seed, hidden=32):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 5))


def data(steps, global_batch=GLOBAL):
    g = torch.Generator().manual_seed(1234)
    return [(torch.randn(global_batch, 20, generator=g), torch.randint(0, 5, (global_batch,), generator=g))
            for _ in range(steps)]


def optimizer_of(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def reference(batches):
    """Plain torch, one process, each step on the whole global batch."""
    model = mlp(0)
    opt = optimizer_of(model.parameters())
    for x, y in batches:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def parallel(batches, accumulate, compression="none"):
    """gpurig train's step: DataParallel, this rank's part of every global batch, K micro-batches."""
    dp = gpurig.DataParallel(mlp(R), compression=compression)
    opt = optimizer_of(dp.parameters())
    mixed = MixedPrecision("fp32", comm)
    for x, y in batches:
        mine = torch.tensor_split(x, P)[R], torch.tensor_split(y, P)[R]
        opt.zero_grad(set_to_none=True)
        assert train_step(dp, dp, opt, *mine, accumulate=accumulate, mixed=mixed).stepped
    return dp


def assert_close(a, b):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(p, q, rtol=RTOL, atol=ATOL), f"{name}: max diff {(p - q).abs().max().item():.3g}"


for k in (2, 3, 4):
    @case(f"accumulate_{k}_equals_one_step_on_the_batch")
    def _(k=k):
        batches = data(STEPS)
        plain, accumulated = parallel(batches, 1), parallel(batches, k)
        assert_close(accumulated.module, plain.module)
        assert_close(accumulated.module, reference(batches))
        # communication only on the last micro-batch: one average per optimizer step, the same bytes as plain
        assert accumulated.stats.steps == plain.stats.steps == (STEPS if P > 1 else 0)
        assert accumulated.stats.bytes_sent == plain.stats.bytes_sent


@case("accumulate_uneven_micro_batches")
def _():
    batches = data(STEPS, global_batch=10 * P)  # 10 samples per rank in 3 micro-batches: 4, 3, 3
    assert_close(parallel(batches, 3).module, reference(batches))


@case("fp16_overflow_on_one_rank_is_skipped_on_every_rank")
def _():
    # Plain models with no gradient averaging, as the split layers of model parallelism: only the scaler's own
    # agreement can make the ranks skip together.
    model = mlp(0)
    opt = optimizer_of(model.parameters())
    mixed = MixedPrecision("fp16", comm)
    verdicts, weights = [], []
    for step, (x, y) in enumerate(data(4)):
        if step == 2 and R == P - 1:
            x = x * 1e30  # this rank's forward overflows fp16: Inf in its gradients only
        opt.zero_grad(set_to_none=True)
        verdicts.append(train_step(model, None, opt, x, y, accumulate=1, mixed=mixed).stepped)
        weights.append(model[0].weight.detach().clone())
    everyone = comm.allgather(torch.tensor([verdicts], dtype=torch.float64))
    assert everyone.tolist() == [[1.0, 1.0, 0.0, 1.0]] * P, everyone.tolist()
    assert torch.equal(weights[2], weights[1])  # the skipped step left the weights alone
    assert mixed.skipped_steps == 1 and mixed.scale_value == 2.0 ** 15
    assert all(torch.isfinite(p).all() for p in model.parameters())


@case("fp32_nan_on_one_rank_without_averaging_is_skipped_on_every_rank")
def _():
    # model parallelism's split layers: no DataParallel guards their gradients, check_finite does, every rank together
    model = mlp(0)
    opt = optimizer_of(model.parameters())
    mixed = MixedPrecision("fp32", comm, nonfinite="skip", check_finite=True)
    verdicts = []
    for step, (x, y) in enumerate(data(3)):
        opt.zero_grad(set_to_none=True)
        if step == 1 and R == 0:
            x = x * float("nan")
        verdicts.append(train_step(model, None, opt, x, y, accumulate=1, mixed=mixed).stepped)
    everyone = comm.allgather(torch.tensor([verdicts], dtype=torch.float64))
    assert everyone.tolist() == [[1.0, 0.0, 1.0]] * P, everyone.tolist()
    assert mixed.skipped_steps == 1 and all(torch.isfinite(p).all() for p in model.parameters())


@case("fp16_data_parallel_with_int8_keeps_finite_residuals")
def _():
    # An overflow's Inf passes through int8 compression's error feedback: the skip must not leave it there.
    dp = gpurig.DataParallel(mlp(0), compression="int8", nonfinite="ignore")
    opt = optimizer_of(dp.parameters())
    mixed = MixedPrecision("fp16", comm)
    stepped = []
    for step, (x, y) in enumerate(data(4)):
        mine = [torch.tensor_split(t, P)[R] for t in (x, y)]
        if step == 1 and R == 0:
            mine[0] = mine[0] * 1e30
        opt.zero_grad(set_to_none=True)
        stepped.append(train_step(dp, dp, opt, *mine, accumulate=2, mixed=mixed).stepped)
    assert stepped == [True, False, True, True], stepped
    for bucket in dp.buckets:
        assert bucket.state.sent is None or torch.isfinite(bucket.state.sent).all()
    assert all(torch.isfinite(p).all() for p in dp.parameters())


write(R)
