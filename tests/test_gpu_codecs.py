"""The codecs on a GPU: their Triton encoders (gpurig.parallel.native.gpu) give the C kernels' codes and scales,
and their kernels replayed as CUDA graphs (gpurig.parallel.graphs) the bits of running them one by one.

The GPU tests are skipped without one; benchmarks/on_gpu.sh runs them on a lent one (PARTS=gpu-tests). Where
Triton is installed, its interpreter runs the kernels on this CPU against the C kernels. On a CPU, graphs.run is
the plain call, which the codec tests cover.
"""

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from gpurig.parallel import codecs, graphs, native
from test_codecs import dynamic_edge_block

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


def test_on_cpu_tensors_a_call_is_just_the_call_and_nothing_is_kept():
    graphs.clear()
    x = torch.arange(4.0)
    for _ in range(3):
        graphs.run(torch.Tensor.add_, x, 1.0)
    assert x.tolist() == [3.0, 4.0, 5.0, 6.0]
    assert len(graphs._graphs) == 0


def _feedback_steps(codec, x0, steps, grads):
    """``steps`` training steps of encode-with-feedback then decode on fixed buffers; every step's outputs."""
    x, residual = x0.clone(), torch.zeros_like(x0)
    payload = codecs.empty_payload(codec, x0.numel(), x0.device)
    out, acc = torch.empty_like(x0), torch.zeros_like(x0)
    seen = []
    for g in grads[:steps]:
        x.copy_(g)
        codecs.encode_with_feedback(codec, x, residual, payload)
        codecs.decode_into(codec, payload, out)
        codecs.decode_add(codec, payload, acc, torch.empty_like(x0))
        seen.append([t.clone() for t in (*payload, out, residual, acc, x)])
    return seen


@cuda
@pytest.mark.parametrize("name", [n for n in codecs.CODECS if n != "none"])
def test_a_codec_replayed_as_a_graph_gives_the_bits_of_its_eager_kernels(name):
    codec = codecs.get(name)
    n = 64 * codecs.BLOCK
    gen = torch.Generator(device="cuda").manual_seed(7)
    grads = [torch.randn(n, device="cuda", generator=gen) * 10.0 ** -k for k in range(5)]
    grads[3][::97] = 0.0  # zeros, and a block with tiny values, where the dynamic type's smallest codes are
    grads[4][: codecs.BLOCK] *= 1e-6
    graphs.clear()
    with graphs.eager():
        expected = _feedback_steps(codec, grads[0], 5, grads)
    got = _feedback_steps(codec, grads[0], 5, grads)
    torch.cuda.synchronize()
    assert any(g is not None for g in graphs._graphs.values()), "nothing was captured"
    for step, (e, g) in enumerate(zip(expected, got)):
        for a, b in zip(e, g):
            assert torch.equal(a, b), f"{name}: step {step} differs"


@cuda
def test_a_call_that_waits_on_the_host_is_not_captured_and_still_runs():
    graphs.clear()
    x = torch.ones(8, device="cuda")

    def doubles_if_positive(t):
        if t.sum().item() > 0:  # a host synchronisation: cannot be captured
            t.mul_(2)

    for _ in range(3):
        graphs.run(doubles_if_positive, x)
    assert x.tolist() == [8.0] * 8


@cuda
def test_new_buffers_make_a_new_graph_and_the_old_ones_still_replay_right():
    graphs.clear()
    a, b = torch.ones(4, device="cuda"), torch.full((4,), 10.0, device="cuda")
    for _ in range(3):
        graphs.run(torch.Tensor.add_, a, 1.0)
        graphs.run(torch.Tensor.add_, b, 1.0)
    assert a.tolist() == [4.0] * 4 and b.tolist() == [13.0] * 4


def _edge_values(edges: bool = True) -> torch.Tensor:
    """Blocks of the values the encoders must get right: the dynamic type's midpoints and the floats beside them,
    the same scaled tiny and negated (``edges``), random gradients over eight decades, NaN and infinities."""
    edges = dynamic_edge_block() if edges else torch.zeros(0)
    gen = torch.Generator().manual_seed(3)
    n = 4 * codecs.BLOCK
    spread = torch.randn(n, generator=gen) * torch.logspace(-8, 0, n)[torch.randperm(n, generator=gen)]
    special = torch.zeros(codecs.BLOCK)
    special[:5] = torch.tensor([float("nan"), 3.0, -5.0, 1e-38, 0.0])
    infinite = torch.zeros(codecs.BLOCK)
    infinite[:3] = torch.tensor([float("inf"), -float("inf"), 2.0])
    return torch.cat([edges, edges * 1e-20, -edges, spread, special, infinite])


def _with_c_kernel(name: str, x: torch.Tensor, residual: torch.Tensor, add: bool):
    codec = codecs.get(name)
    x, residual, payload = x.clone(), residual.clone(), codecs.empty_payload(codec, x.numel())
    codec.encode_residual(x, residual, payload, add)
    return [*payload, x, residual]


def _same(got, expected, name):
    codes, scale, x, residual = got
    assert torch.equal(codes, expected[0]), f"{name}: codes differ at {(codes != expected[0]).nonzero()[:5].tolist()}"
    assert torch.equal(scale.nan_to_num(7.0), expected[1].nan_to_num(7.0)), f"{name}: scales differ"
    assert torch.equal(x.nan_to_num(7.0), expected[2].nan_to_num(7.0)), f"{name}: corrected values differ"
    finite = torch.isfinite(residual) & torch.isfinite(expected[3])
    assert torch.equal(finite, torch.isfinite(expected[3]))
    # codes and scales are exact; a residual may round its last multiply-add differently (the C compiler's fusing)
    assert torch.allclose(residual[finite], expected[3][finite], rtol=0,
                          atol=2e-7 * expected[1].nan_to_num(0, 0, 0).max().item())


@pytest.mark.skipif(native.library() is None or importlib.util.find_spec("triton") is None,
                    reason="needs Triton (for its interpreter) and the C kernels to hold it against")
def test_the_triton_encoders_give_the_c_kernels_codes_in_tritons_interpreter(tmp_path):
    """Triton's interpreter runs the kernels on this CPU. Its multiply-adds round twice, so here the codes and
    scales of random gradients are held exact, and not those a last bit moves across a midpoint: on a GPU, the
    test below holds them to the C kernels on every edge."""
    script = tmp_path / "check.py"
    script.write_text(textwrap.dedent("""
        import torch
        from test_gpu_codecs import _edge_values, _with_c_kernel, _same
        from gpurig.parallel import codecs
        from gpurig.parallel.native import _triton_kernels as kernels
        x = _edge_values(edges=False)
        x = x[torch.isfinite(x)]
        x = torch.cat([x, x.new_zeros(-x.numel() % codecs.BLOCK)])
        residual = torch.randn(x.numel(), generator=torch.Generator().manual_seed(1)) * 1e-3
        for name, kernel in (("int8", "int8_encode_feedback"), ("int8-dynamic", "dynamic_encode_feedback")):
            for add in (False, True):
                expected = _with_c_kernel(name, x, residual, add)
                got = [*codecs.empty_payload(codecs.get(name), x.numel()), x.clone(), residual.clone()]
                extra = (codecs._tables(x.device),) if name == "int8-dynamic" else ()
                getattr(kernels, kernel)(got[2], got[3], add, got[0], got[1], x.numel(), codecs.BLOCK,
                                         codecs._SMALLEST_SCALE, *extra)
                got[3] = expected[3]  # residuals: see the docstring
                _same(got, expected, name)
        print("same")
    """))
    tests = os.path.dirname(__file__)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([tests, *sys.path]))
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "same", done.stderr[-3000:]


@cuda
@pytest.mark.skipif(native.library() is None, reason="no C compiler here to hold the GPU's codes against")
@pytest.mark.parametrize("name", ["int8", "int8-dynamic"])
@pytest.mark.parametrize("add", [False, True])
def test_on_a_gpu_the_encoders_give_the_c_kernels_codes_scales_and_residuals(name, add):
    """What the GPU computes (Triton's kernel where Triton is installed, else torch's) is what the C kernel
    computes on the CPU: every code and scale, NaN and infinity included, every residual to its last bit's
    rounding."""
    x = _edge_values()
    residual = torch.randn(x.numel(), generator=torch.Generator().manual_seed(1)) * 1e-3
    expected = _with_c_kernel(name, x, residual, add)
    codec = codecs.get(name)
    on_gpu = [*codecs.empty_payload(codec, x.numel(), "cuda"), x.cuda(), residual.cuda()]
    codec.encode_residual(on_gpu[2], on_gpu[3], tuple(on_gpu[:2]), add)
    _same([t.cpu() for t in on_gpu], expected, name)
