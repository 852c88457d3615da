"""Split layers, gpurig.parallelize and hybrid training on N ranks against plain single-process torch.

Every rank computes the unsplit reference itself (plain torch, same seed, no
communication) and compares. Tolerance, everywhere: rtol 1e-5 / atol 1e-6
(the same float32 products, summed in another order) — for a split layer's
outputs and gradients against nn.Linear's, and for training step for step: the
loss of every step and every weight after it, 5 steps of SGD with momentum (and
Adam), as tests/workers/data_parallel.py states for data parallelism.
"""

import torch
import torch.nn.functional as F
from torch import nn

import gpurig
from casekit import case, write
from gpurig.parallel import (ColumnParallelLinear, PlanError, RowParallelLinear, krizhevsky_plan,
                             optimizer_state_bytes, parameter_bytes, parallelize)
from gpurig.parallel.model_parallel import Exchanges

comm = gpurig.init()
R, P = comm.rank, comm.size
H = 48                     # hidden width: divides over 2, 3 and 4 ranks
RTOL, ATOL = 1e-5, 1e-6
STEPS = 5


def close(got, want, what, rtol=RTOL, atol=ATOL):
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.allclose(got, want, rtol=rtol, atol=atol), f"{what}: max diff {(got - want).abs().max().item():.3g}"


def seeded(seed, make):
    torch.manual_seed(seed)
    return make()


def batch(rows, features, seed=1234, classes=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, features, generator=g), torch.randint(0, classes, (rows,), generator=g)


def mine(t):
    return torch.tensor_split(t, P)[R]


# -- memory first: the peak resident set is read since this case began -------------------------------------------

def resident_mb(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field)) / 1024


def train_steps(net, x, y, steps=STEPS):
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return opt, losses


@case("memory[a layer over the per-rank budget trains when split]")
def _():
    inputs, outputs = 2048, 12288                   # 25 M parameters, 96 MiB of float32 weights
    layer_mb = inputs * outputs * 4 / 2**20
    budget_mb = 2 * layer_mb                        # weights + gradients + momentum of the whole layer: 3x
    # The same operations on a tiny model first: the libraries' code pages (oneDNN, MPI) count as resident too.
    train_steps(parallelize(nn.Sequential(nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 10)), {"0": "column", "2": "row"}),
                torch.ones(4, 8), torch.zeros(4, dtype=torch.long), steps=2)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                                # restart the peak (VmHWM) from the current resident set
    before = resident_mb("VmRSS")
    with torch.device("meta"):                      # never built whole, on any rank
        net = nn.Sequential(nn.Linear(inputs, outputs), nn.ReLU(), nn.Linear(outputs, 10))
    torch.manual_seed(0)
    net = parallelize(net, {"0": "column", "2": "row"})
    opt, losses = train_steps(net, *batch(32, inputs, classes=10))
    growth_mb = resident_mb("VmHWM") - before
    held = (outputs * inputs + outputs + 10 * outputs) // P * 4 + 10 * 4
    assert parameter_bytes(net) == held, (parameter_bytes(net), held)
    assert optimizer_state_bytes(opt) == held  # momentum: one buffer per parameter this rank holds
    assert 3 * layer_mb > budget_mb, "the whole layer's training state must exceed the budget"
    assert P == 1 or growth_mb < budget_mb, f"peak grew by {growth_mb:.0f} MB, budget {budget_mb:.0f} MB"
    assert losses[-1] < 0.5 * losses[0], losses   # it learns (one batch, memorised)


# -- one split layer against nn.Linear -----------------------------------------------------------------------------

def run_layer(layer, x, upstream):
    x = x.detach().clone().requires_grad_()
    y = layer(x)
    (y * upstream).sum().backward()
    return y, x.grad


for gather in (True, False):
    @case(f"column_equals_linear[gather_output={gather}]")
    def _(gather=gather):
        fc = seeded(0, lambda: nn.Linear(20, H))
        x, _ = batch(8, 20)
        upstream = torch.randn(8, H, generator=torch.Generator().manual_seed(5))
        want, want_dx = run_layer(fc, x, upstream)
        split = ColumnParallelLinear.from_linear(fc, gather_output=gather)
        got, got_dx = run_layer(split, x, upstream if gather else upstream.chunk(P, -1)[R])
        close(got, want if gather else want.chunk(P, -1)[R], "output")
        close(got_dx, want_dx, "input gradient")
        close(split.weight.grad, fc.weight.grad.chunk(P)[R], "weight gradient")
        close(split.bias.grad, fc.bias.grad.chunk(P)[R], "bias gradient")


for parallel_input in (False, True):
    @case(f"row_equals_linear[input_is_parallel={parallel_input}]")
    def _(parallel_input=parallel_input):
        fc = seeded(0, lambda: nn.Linear(H, 6))
        x, _ = batch(8, H)
        upstream = torch.randn(8, 6, generator=torch.Generator().manual_seed(5))
        want, want_dx = run_layer(fc, x, upstream)
        split = RowParallelLinear.from_linear(fc, input_is_parallel=parallel_input)
        got, got_dx = run_layer(split, x.chunk(P, -1)[R] if parallel_input else x, upstream)
        close(got, want, "output")
        close(got_dx, want_dx.chunk(P, -1)[R] if parallel_input else want_dx, "input gradient")
        close(split.weight.grad, fc.weight.grad.chunk(P, dim=1)[R], "weight gradient")
        close(split.bias.grad, fc.bias.grad, "bias gradient")


@case("column_row_chain_equals_the_unsplit_pair_with_one_exchange_each_way")
def _():
    pair = seeded(0, lambda: nn.Sequential(nn.Linear(20, H), nn.ReLU(), nn.Linear(H, 6)))
    x, _ = batch(8, 20)
    upstream = torch.randn(8, 6, generator=torch.Generator().manual_seed(5))
    want, want_dx = run_layer(pair, x, upstream)
    net = parallelize(seeded(0, lambda: nn.Sequential(nn.Linear(20, H), nn.ReLU(), nn.Linear(H, 6))),
                      {"0": "column", "2": "row"})
    assert not net.module[0].gather_output and net.module[2].input_is_parallel
    x = x.clone().requires_grad_()
    y = net(x)
    assert net.exchanges.stats.calls == 1, net.exchanges.stats      # forward: the row layer's sum only
    (y * upstream).sum().backward()
    assert net.exchanges.stats.calls == 2, net.exchanges.stats      # backward: the column layer's input gradient
    close(y, want, "output")
    close(x.grad, want_dx, "input gradient")
    close(net.module[0].weight.grad, pair[0].weight.grad.chunk(P)[R], "column weight gradient")
    close(net.module[2].weight.grad, pair[2].weight.grad.chunk(P, dim=1)[R], "row weight gradient")
    close(net.module[2].bias.grad, pair[2].bias.grad, "row bias gradient")
    assert net.stats.steps == 1 and net.stats.bytes_sent == 2 * 8 * 6 * 4 * (P - 1) // P + 2 * 8 * 20 * 4 * (P - 1) // P


@case("new_layers_draw_a_different_slice_per_rank")
def _():
    torch.manual_seed(0)
    column, row = ColumnParallelLinear(20, H), RowParallelLinear(H, 6)
    slices = comm.allgather(column.weight.detach().clone())  # stacked: the whole weight
    assert slices.abs().max() <= 1 / 20 ** 0.5
    assert len({str(s.tolist()) for s in slices.chunk(P)}) == P, "ranks drew the same slice: duplicated units"
    biases = comm.allgather(row.bias.detach().view(1, -1).clone())
    assert torch.equal(biases, biases[:1].expand_as(biases)), "a whole bias must be the same on every rank"


# -- training: N ranks against one process on the whole batch -------------------------------------------------------

def mlp(seed):
    return seeded(seed, lambda: nn.Sequential(nn.Flatten(), nn.Linear(20, H), nn.ReLU(), nn.Linear(H, H), nn.ReLU(),
                                              nn.Linear(H, 5)))


def cnn(seed):
    return seeded(seed, lambda: nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 4, 3), nn.ReLU(),
                                              nn.MaxPool2d(2), nn.Flatten(), nn.Linear(36, H), nn.ReLU(),
                                              nn.Linear(H, 5)))


class Custom(nn.Module):
    """Not a Sequential: activations in forward, layers registered by attribute."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc1, self.fc2 = nn.Conv2d(1, 3, 3), nn.Linear(108, H), nn.Linear(H, 5)

    def forward(self, x):
        x = F.relu(self.conv(x.view(-1, 1, 8, 8))).flatten(1)
        return self.fc2(F.relu(self.fc1(x)))


OPTIMIZERS = {"sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
              "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2)}


def reference_run(model, make_opt, batches, parts=1):
    """Losses and weights after every step, one process; the loss is the mean of ``parts`` per-part means."""
    opt = make_opt(model.parameters())
    record = []
    for x, y in batches:
        opt.zero_grad()
        loss = sum(F.cross_entropy(model(xs), ys) for xs, ys in zip(torch.tensor_split(x, parts),
                                                                     torch.tensor_split(y, parts))) / parts
        loss.backward()
        opt.step()
        record.append((loss.item(), {k: v.clone() for k, v in model.state_dict().items()}))
    return record, opt


def parallel_run(net, make_opt, batches, hybrid):
    opt = make_opt(net.parameters())
    record = []
    for x, y in batches:
        if hybrid:
            x, y = mine(x), mine(y)
        opt.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        global_loss = comm.allreduce(loss.detach().clone()) if hybrid else loss.detach()  # mean of per-rank means
        record.append((global_loss.item(), {k: v.clone() for k, v in net.full_state_dict().items()}))
    return record, opt


def assert_same_run(got, want):
    for step, ((loss, weights), (ref_loss, ref_weights)) in enumerate(zip(got, want)):
        close(torch.tensor(loss), torch.tensor(ref_loss), f"loss of step {step}")
        assert weights.keys() == ref_weights.keys()
        for name in weights:
            close(weights[name], ref_weights[name], f"{name} after step {step}")


def training_case(name, make_model, hybrid, rows, make_opt=OPTIMIZERS["sgd_momentum"], plan=None):
    @case(name)
    def _():
        features = 20 if make_model is mlp else 64
        batches = [batch(rows, features, seed=s) for s in range(STEPS)]
        want, _ = reference_run(make_model(0), make_opt, batches, parts=P if hybrid else 1)
        # Every rank starts from different weights: parallelize must take rank 0's.
        model = make_model(0 if R == 0 else 100 + R)
        net = parallelize(model, plan or krizhevsky_plan(model), hybrid=hybrid)
        got, _ = parallel_run(net, make_opt, batches, hybrid)
        assert_same_run(got, want)
        if not hybrid:  # layers nobody splits are computed alike everywhere: bit for bit
            for n, p in net.module.named_parameters():
                if n not in net.split_dims:
                    everyone = comm.allgather(p.detach().unsqueeze(0).clone())
                    assert torch.equal(everyone, everyone[:1].expand_as(everyone)), f"{n} drifted apart across ranks"


for opt_name, make_opt in OPTIMIZERS.items():
    training_case(f"model_parallel_training_equals_one_process[mlp-{opt_name}]", mlp, False, 24, make_opt)
training_case("model_parallel_training_equals_one_process[cnn]", cnn, False, 24)
training_case("hybrid_training_equals_one_process[cnn]", cnn, True, 8 * P)
training_case("hybrid_training_equals_one_process[cnn, uneven parts]", cnn, True, 8 * P + 1)
training_case("hybrid_training_equals_one_process[mlp: batch gathered at the input]", mlp, True, 8 * P)
training_case("hybrid_training_equals_one_process[custom module]", lambda seed: seeded(seed, Custom), True, 8 * P,
              plan={"fc1": "column", "fc2": "row"})
# every layer that trains is split (a LLaMA-style MLP, no biases): nothing is left for a DataParallel to average
training_case("hybrid_training_equals_one_process[all split, no bias]",
              lambda seed: seeded(seed, lambda: nn.Sequential(nn.Linear(64, H, bias=False), nn.ReLU(),
                                                              nn.Linear(H, 5, bias=False))), True, 8 * P,
              plan={"0": "column", "2": "row"})


@case("optimizer_state_gathers_whole_and_cuts_again")
def _():
    batches = [batch(8 * P, 64, seed=s) for s in range(2)]
    _, ref_opt = reference_run(cnn(0), OPTIMIZERS["sgd_momentum"], batches, parts=P)
    net = parallelize(cnn(0), krizhevsky_plan(cnn(0)), hybrid=True)
    _, opt = parallel_run(net, OPTIMIZERS["sgd_momentum"], batches, hybrid=True)
    full = net.full_optimizer_state(opt)
    for index, state in ref_opt.state_dict()["state"].items():
        close(full["state"][index]["momentum_buffer"], state["momentum_buffer"], f"momentum of parameter {index}")
    again = parallelize(cnn(0), krizhevsky_plan(cnn(0)), hybrid=True)
    fresh = OPTIMIZERS["sgd_momentum"](again.parameters())
    fresh.load_state_dict(again.local_optimizer_state(fresh, full))
    for index, state in opt.state_dict()["state"].items():
        assert torch.equal(fresh.state_dict()["state"][index]["momentum_buffer"], state["momentum_buffer"])


@case("shard_without_split_gives_every_rank_the_whole_batch")
def _():
    batches = gpurig.shard((torch.arange(100),), global_batch=64, split=False, seed=3)
    got = next(iter(batches))
    everyone = comm.allgather(got.unsqueeze(0))
    assert got.numel() == 64 and torch.equal(everyone, everyone[:1].expand_as(everyone))
    assert torch.equal(got, batches.order()[:64])


# -- bad plans and misuse: one clear line, on every rank, before any communication --------------------------------

BAD_PLANS = {
    "missing_layer": (mlp, {"fc9": "column"}, False, "the model has no layer 'fc9'; its nn.Linear layers are '1', '3', '5'"),
    "not_linear": (cnn, {"1": "column"}, False, "'1' is a Conv2d, not an nn.Linear"),
    "unknown_split": (mlp, {"1": "columns"}, False, "'1': unknown split 'columns'"),
    "does_not_divide": (mlp, {"5": "column"}, False, "'5' (column) has 5 output features, which do not split evenly"),
    "impossible_chain": (lambda s: nn.Sequential(nn.Linear(8, 12), nn.ReLU(), nn.Linear(24, 6)),
                         {"0": "column", "2": "row"}, False, "'0' (column, 12 outputs) cannot feed '2' (row, 24 inputs)"),
    "hybrid_starts_with_row": (mlp, {"3": "row"}, True, "the first split layer '3' is 'row'; it must be 'column'"),
}
for bad, (make_model, plan, hybrid, message) in BAD_PLANS.items():
    @case(f"bad_plan[{bad}]")
    def _(make_model=make_model, plan=plan, hybrid=hybrid, message=message):
        if bad == "does_not_divide" and P == 1:
            return
        try:
            parallelize(make_model(0), plan, hybrid=hybrid)
        except PlanError as error:
            assert message in str(error) and "\n" not in str(error), str(error)
        else:
            raise AssertionError("no PlanError")


@case("model_parallelism_refuses_different_inputs_per_rank")
def _():
    net = parallelize(mlp(0), krizhevsky_plan(mlp(0)))
    try:
        net(torch.full((4, 20), float(R)))
    except ValueError as error:
        assert P > 1 and "the same input on every rank" in str(error), str(error)
    else:
        assert P == 1, "no error for different inputs"


@case("row_layer_names_a_wrong_input_width")
def _():
    row = RowParallelLinear(H, 6, input_is_parallel=True, exchanges=Exchanges())
    try:
        row(torch.zeros(2, H))
    except ValueError as error:
        assert P == 1 or f"expects {H // P} input features (this rank's slice" in str(error), str(error)
    else:
        assert P == 1


write(R)
