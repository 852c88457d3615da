"""SEEDS.md's hardware numbers, each from gpurig's general formulas (never a hard-coded answer path)."""


import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import gpurig.perf.busbw
import gpurig.perf.fit
import gpurig.perf.power
import gpurig.perf.transfer
import gpurig.units
from gpurig.perf import power, transfer
from gpurig.perf.busbw import bus_factor, busbw
from gpurig.perf.fit import fit_latency_bandwidth
from gpurig.units import BINARY, DECIMAL, bytes_per_second, tensor_bytes

IMAGENET_BATCH = tensor_bytes((32, 225, 225, 3))     # fp32
TWO_WEEKS_H = 14 * 24


@pytest.mark.parametrize("lanes,ms", [(16, 1.15), (8, 2.30), (4, 4.60)])
def test_imagenet_batch_over_pcie3_at_15_75_gib_per_s(lanes, ms):
    # The PCIe 3.0 rate comes from the catalog's generation table (8 GT/s, 128b/130b); the source reads its
    # "GB/s" as 2^30 bytes.
    rate = transfer.quoted_rate_bytes_per_s(transfer.pcie_gbytes_per_s("3.0", lanes), "GB/s", base=BINARY)
    assert round(1e3 * transfer.transfer_seconds(IMAGENET_BATCH, rate), 2) == ms


def test_pcie3_x16_is_the_sources_15_75():
    assert round(transfer.pcie_gbytes_per_s(3, 16), 2) == 15.75
    assert round(transfer.pcie_gbytes_per_s(2, 16), 2) == 8.0          # 8b/10b
    assert transfer.pcie_gbytes_per_s(4, 16) == pytest.approx(2 * transfer.pcie_gbytes_per_s(3, 16))


def test_pageable_copies_are_the_sources_twice_as_slow():
    rate = bytes_per_second(15.75, "GB/s", base=BINARY)
    pinned = transfer.transfer_seconds(IMAGENET_BATCH, rate, efficiency=transfer.host_copy_efficiency(True))
    pageable = transfer.transfer_seconds(IMAGENET_BATCH, rate, efficiency=transfer.host_copy_efficiency(False))
    assert pageable == pytest.approx(2 * pinned)


@pytest.mark.parametrize("base,ms", [(BINARY, 185), (DECIMAL, 194)])
def test_imagenet_batch_from_a_100_mb_per_s_disk(base, ms):
    assert round(1e3 * transfer.transfer_seconds(IMAGENET_BATCH, bytes_per_second(100, "MB/s", base=base))) == ms


@pytest.mark.parametrize("base,ms", [(BINARY, 0.745), (DECIMAL, 0.80)])
def test_1000x1000_gradient_over_40_gbit(base, ms):
    seconds = transfer.transfer_seconds(tensor_bytes((1000, 1000)), bytes_per_second(40, "Gbit/s", base=base))
    assert round(1e3 * seconds, 3) == pytest.approx(ms)


@pytest.mark.parametrize("gpus,quoted", [(6, 1.6), (12, 0.72), (24, 0.35), (48, 0.17)])
def test_infiniband_shared_by_the_other_gpus(gpus, quoted):
    # 8 GB/s shared by N - 1 peers; the post truncates 8/11 = 0.727 to 0.72, the others it rounds
    assert transfer.shared_rate(8.0, gpus - 1) == pytest.approx(quoted, abs=0.01)


def test_psu_three_versions_from_one_formula():
    gpus, cpu = [250] * 4, 150
    assert power.psu_watts(gpus, cpu) == pytest.approx(1265)                           # gpurig: the summary rule
    assert power.psu_size(power.psu_watts(gpus, cpu)) == 1300
    assert power.psu_watts(gpus, cpu, other_w=100, headroom=0) == pytest.approx(1250)  # example, first step
    example = power.psu_watts(gpus, cpu, other_w=100)
    assert example == pytest.approx(1375)                                              # example + 10 %
    assert power.psu_size(example, step_w=100) == 1400 == power.psu_size(example)


def test_energy_two_weeks_and_the_corrected_psu_surcharge():
    low, high = power.energy_kwh(1000, TWO_WEEKS_H), power.energy_kwh(1500, TWO_WEEKS_H)
    assert (low, high) == (336, 504)
    assert round(power.energy_cost(low, 0.20)) == 67 and round(power.energy_cost(high, 0.20)) == 101
    extra = [power.efficiency_surcharge(w, TWO_WEEKS_H, 0.20, 0.8) for w in (1000, 1500)]
    assert [round(e, 1) for e in extra] == [16.8, 25.2]                # the post says 18–26 €
    # An 80 % PSU multiplies the bill by 1.25; on the post's rounded 60–100 € that is 15–25 € extra.
    assert [round(0.25 * c) for c in (60, 100)] == [15, 25]
    assert power.wall_energy_kwh(1000, 1, 0.8) == pytest.approx(1.25 * power.energy_kwh(1000, 1))


def test_busbw_factors_are_nccl_tests():
    for n in (2, 4, 8):
        assert bus_factor("allreduce", n) == pytest.approx(2 * (n - 1) / n)
        assert bus_factor("allgather", n) == bus_factor("reduce_scatter", n) == pytest.approx((n - 1) / n)
        assert bus_factor("broadcast", n) == 1
    assert busbw("allreduce", 1e9, 1.0, 4) == pytest.approx(1.5e9)
    with pytest.raises(ValueError):
        bus_factor("allscatter", 2)


def test_alpha_beta_fit_recovers_a_known_line():
    alpha, beta = 20e-6, 1 / 5e9
    sizes = [2 ** k for k in range(10, 27, 2)]
    fit = fit_latency_bandwidth(sizes, [alpha + s * beta for s in sizes])
    assert fit.alpha == pytest.approx(alpha, rel=0.01) and fit.beta == pytest.approx(beta, rel=1e-6)
    noisy = fit_latency_bandwidth(sizes, [(alpha + s * beta) * (1.1 if i % 2 else 0.9) for i, s in enumerate(sizes)])
    assert noisy.bytes_per_s == pytest.approx(5e9, rel=0.25)


def test_units_refuse_nonsense():
    with pytest.raises(ValueError):
        bytes_per_second(1, "GB")          # a size, not a rate
    with pytest.raises(ValueError):
        bytes_per_second(1, "parsecs/s")
    assert gpurig.units.gbit_per_s("56Gbps") == 56


class _TinyLanguageModel(torch.nn.Module):
    """Embedding, one hidden layer, logits over a large vocabulary: the logits dwarf everything else."""

    def __init__(self, vocab: int = 20000, width: int = 64):
        super().__init__()
        self.embed, self.hidden = torch.nn.Embedding(vocab, width), torch.nn.Linear(width, width)
        self.head = torch.nn.Linear(width, vocab, bias=False)

    def forward(self, tokens):
        return self.head(torch.relu(self.hidden(self.embed(tokens))))


class _LiveTensorBytes(TorchDispatchMode):
    """Bytes of the storages the operators a step dispatches create, while they live, and their peak: the
    tensors a step holds, as a GPU's allocator holds them. Not the CPU allocator's own count, which also holds
    what a CPU kernel allocates for itself inside one operator: on a CPU without native bf16 arithmetic a bf16
    matrix product converts its operands to FP32 first (3 MB allocated for a 1 MB product), which no GPU does."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self.held: set = set()

    def _release(self, address: int, nbytes: int) -> None:
        self.held.discard(address)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # a view's or an in-place result's storage is one of its inputs' (held before the step, or already counted)
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for tensor in tree_leaves(out):
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            address = storage.data_ptr()
            if address and address not in self.held and address not in inputs:
                self.held.add(address)
                self.live += storage.nbytes()
                weakref.finalize(storage, self._release, address, storage.nbytes())
        self.peak = max(self.peak, self.live)
        return out


def _allocation_peak(step) -> int:
    """Bytes a second call of ``step`` holds beyond what it held before, at their peak (:class:`_LiveTensorBytes`);
    the first call makes what stays (gradients' buffers, the optimizer's state)."""
    step()
    with _LiveTensorBytes() as live:
        step()
    return live.peak


def test_a_language_models_step_peaks_where_the_footprint_says():
    """The bytes a real CPU training step allocates beyond what it held before (weights and momentum), at their
    peak (the storages its operators create, :class:`_LiveTensorBytes`), against the footprint's activations, output and loss, and gradients.
    The logits (8 × 256 × 20,000 floats, 164 MB) are most of it: without the output and the loss's four copies,
    the footprint said a fifth of it."""
    from gpurig.models.describe import describe
    from gpurig.perf.footprint import step_memory

    torch.manual_seed(0)
    model, batch, tokens = _TinyLanguageModel(), 8, 256
    x = torch.randint(0, 20000, (batch, tokens))
    y = torch.randint(0, 20000, (batch * tokens,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step():
        optimizer.zero_grad(set_to_none=True)
        out = model(x)
        torch.nn.functional.cross_entropy(out.view(-1, out.shape[-1]), y).backward()
        optimizer.step()

    peak = _allocation_peak(step)
    parts = step_memory(describe(model, x[:1], batch=batch), "momentum", mixed=False, ranks=1)
    predicted = parts["activations"] + parts["output_and_loss"] + parts["gradients"]
    assert abs(predicted / peak - 1) < 0.1, (predicted, peak, parts)
    assert parts["activations"] + parts["gradients"] < 0.3 * peak  # what the footprint counted before


def test_a_mixed_precision_transformer_step_peaks_where_the_footprint_says():
    """The same peak for a small GPT-2 whose tensors are typed as CUDA's autocast types them (products in
    16 bits; layer norms, softmax and the loss in FP32; the residual stream FP32): MetaAutocast on CPU tensors, since
    torch.autocast("cpu") runs layer norms in 16 bits. Halving the FP32 activations, as the footprint did, falls
    short. No dropout: on a CPU, attention with dropout falls back to materialising the scores, which a GPU's fused
    kernel does not."""
    from gpurig.models.autocast import MetaAutocast
    from gpurig.models.describe import describe
    from gpurig.models.text import GPT2
    from gpurig.perf.footprint import step_memory

    torch.manual_seed(0)
    model, batch, tokens = GPT2(width=64, layers=2, heads=2, vocab=64, context=256, dropout=0.0), 8, 256
    x = torch.randint(0, 64, (batch, tokens))
    y = torch.randint(0, 64, (batch * tokens,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with MetaAutocast(torch.bfloat16):
            out = model(x)
            loss = torch.nn.functional.cross_entropy(out.view(-1, out.shape[-1]), y)
        loss.backward()
        optimizer.step()

    peak = _allocation_peak(step)
    parts = step_memory(describe(model, x[:1], batch=batch, mixed_precision=True), "momentum", mixed=True, ranks=1)
    predicted = parts["activations"] + parts["output_and_loss"] + parts["gradients"] + parts["amp_copies"]
    assert abs(predicted / peak - 1) < 0.05, (predicted, peak, parts)
    halved = step_memory(describe(model, x[:1], batch=batch), "momentum", mixed=True, ranks=1)["activations"]
    assert (predicted - parts["activations"] + halved) / peak < 0.92


def test_a_step_traced_on_the_meta_device_peaks_where_cpu_tensors_do():
    """gpurig.models.peak runs a training step on meta tensors and follows each tensor from its creation until
    autograd lets it go. The same step on CPU tensors, the storages its operators create (:class:`_LiveTensorBytes`): its peak
    beyond what it held before is the traced one, in FP32 and typed as CUDA's autocast types it. A small GPT-2
    with dropout, its attention as a CPU runs it (materialising the scores); a GPU's fused kernel, which the trace
    follows by default, keeps far less."""
    import contextlib

    from gpurig.models.autocast import MetaAutocast
    from gpurig.models.describe import on_meta
    from gpurig.models.peak import trace_step
    from gpurig.models.text import GPT2

    torch.manual_seed(0)
    for mixed in (None, torch.bfloat16):
        model, batch, tokens = GPT2(width=64, layers=2, heads=2, vocab=512, context=256, dropout=0.1), 8, 256
        x = torch.randint(0, 512, (batch, tokens))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def step():
            optimizer.zero_grad(set_to_none=True)
            with MetaAutocast(mixed) if mixed else contextlib.nullcontext():
                out = model(x)
                loss = torch.nn.functional.cross_entropy(out.flatten(0, -2), torch.zeros(batch * tokens).long())
            loss.backward()
            optimizer.step()    # in place: momentum adds nothing at the peak

        peak = _allocation_peak(step)
        traced = trace_step(on_meta(model), x.to("meta"), mixed, cuda=False)
        assert abs((traced["peak"] - x.nbytes) / peak - 1) < 0.01, (mixed, traced, peak)
        assert trace_step(on_meta(model), x.to("meta"), mixed)["peak"] < 0.8 * traced["peak"]


def test_attention_inside_nn_multiheadattention_is_traced_as_a_gpu_runs_it():
    """nn.MultiheadAttention (inside every nn.TransformerEncoderLayer and torchvision's ViT) does its work in a
    Python function that torch function modes used to see only from outside: its projections were not autocast
    and its attention not fused (a ViT-B/16 at 64 in bf16: 8.2 GiB predicted, 5.1 measured on an H100). Now the
    projections come out in 16 bits, the fused attention's peak grows with the tokens, not their square, and the
    step on CPU tensors still peaks where the trace says, in FP32 and typed as autocast types it."""
    import contextlib

    from gpurig.models.autocast import MetaAutocast
    from gpurig.models.describe import on_meta
    from gpurig.models.peak import trace_step

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=2, dim_feedforward=128, dropout=0.1, batch_first=True,
                                             norm_first=True)   # post-norm traces 2 % high (one activation more)
    x = torch.randn(8, 256, 64)
    with MetaAutocast(torch.bfloat16):
        attended, _ = layer.self_attn(x, x, x, need_weights=False)
    assert attended.dtype == torch.bfloat16

    def peak_at(tokens, **how):
        return trace_step(on_meta(layer), torch.empty(8, tokens, 64, device="meta"), **how)["peak"]
    assert peak_at(1024) / peak_at(512) < 2.2                              # fused: linear in the tokens
    assert peak_at(1024, cuda=False) / peak_at(512, cuda=False) > 3  # scores: their square

    for mixed in (None, torch.bfloat16):
        optimizer = torch.optim.SGD(layer.parameters(), lr=0.1, momentum=0.9)

        def step():
            optimizer.zero_grad(set_to_none=True)
            with MetaAutocast(mixed) if mixed else contextlib.nullcontext():
                out = layer(x)
                loss = torch.nn.functional.cross_entropy(out.flatten(0, -2), torch.zeros(8 * 256).long())
            loss.backward()
            optimizer.step()

        peak = _allocation_peak(step)
        traced = trace_step(on_meta(layer), x.to("meta"), mixed, cuda=False)
        assert abs((traced["peak"] - x.nbytes) / peak - 1) < 0.01, (mixed, traced, peak)


def test_adams_step_peaks_with_one_more_copy_of_the_parameters():
    """torch.optim.Adam's foreach step (CUDA's default) computes √v for every parameter at once. At a batch small
    enough for the optimizer's step to be the peak, the step's peak beyond the weights and the moments is
    the gradients and that copy, as the footprint says."""
    from gpurig.models.describe import describe, on_meta
    from gpurig.models.peak import step_peaks
    from gpurig.perf.footprint import step_memory

    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024))
    x = torch.randn(2, 1024)
    optimizer = torch.optim.Adam(model.parameters(), foreach=True)

    def step():
        optimizer.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        optimizer.step()

    peak = _allocation_peak(step)
    parts = step_memory(describe(model, x[:1], batch=2), "adam", False, 1, traced=step_peaks(on_meta(model), x.to("meta")))
    assert parts["optimizer_working"] == parts["gradients"] == parts["weights"]
    held = parts["weights"] + parts["optimizer"]
    assert abs((sum(parts.values()) - held) / peak - 1) < 0.01, (parts, peak)
