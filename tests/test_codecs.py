"""Gradient codecs: error bounds as properties over random, heavy-tailed and all-zero inputs; error feedback.

Hypothesis draws the inputs: any finite float32 values (normal and heavy-tailed
— a few huge values among many tiny ones — and all zeros), any length. Every
codec must stay within its stated bound on every one of them.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpurig.parallel import auto, codecs, native, powersgd
from gpurig.parallel.compression import chunk_length, parse_method, switch_method, wire_bytes, FeedbackState

LOSSY = ["fp16", "bf16", "int8", "int8-dynamic"]
DYNAMIC_GAP = (codecs.dynamic_map()[1:] - codecs.dynamic_map()[:-1]).max().item()


@st.composite
def gradients(draw):
    """A float32 vector as gradients come: normal, heavy-tailed (Cauchy-like), or all zero; length 1..5000."""
    n = draw(st.integers(1, 5000))
    kind = draw(st.sampled_from(["normal", "heavy", "zeros"]))
    seed = draw(st.integers(0, 2**31 - 1))
    scale = 10.0 ** draw(st.integers(-8, 3))
    g = torch.Generator().manual_seed(seed)
    if kind == "zeros":
        return torch.zeros(n)
    x = torch.randn(n, generator=g)
    if kind == "heavy":
        x = x / torch.rand(n, generator=g).clamp_min(1e-4)
    return x * scale


def block_absmax(x):
    padded = torch.cat([x, x.new_zeros(codecs.padded_length(x.numel(), codecs.get("int8")) - x.numel())])
    return padded.view(-1, codecs.BLOCK).abs().amax(dim=1).repeat_interleave(codecs.BLOCK)[: x.numel()]


def bound(name, x):
    """The largest error each codec may make on each value of x."""
    if name == "fp16":  # half the spacing of fp16 at x, subnormals included; beyond 65504 fp16 has no value
        return x.abs() * 2**-11 + 2**-25
    if name == "bf16":
        return x.abs() * 2**-8 + 1e-38
    if name == "int8":  # half a linear level of the block
        return block_absmax(x) / 127 / 2 * 1.0001 + 1e-30
    return block_absmax(x) * (DYNAMIC_GAP / 2 + 2**-12) + 1e-30  # half the widest gap, plus the lookup's resolution


@settings(max_examples=60, deadline=None)
@given(x=gradients(), name=st.sampled_from(LOSSY))
def test_every_codec_stays_within_its_error_bound(x, name):
    if name == "fp16" and x.abs().max() > 65504:
        x = x.clamp(-65504, 65504)  # outside fp16's range there is no bound to state
    codec = codecs.get(name)
    y = codecs.decode(codec, codecs.encode(codec, x), x.numel())
    assert y.shape == x.shape and y.dtype == torch.float32
    excess = (y - x).abs() - bound(name, x)
    assert excess.max() <= 0, f"{name}: worst excess {excess.max().item():.3g} at |x|={x.abs().max().item():.3g}"
    if not torch.any(x):
        assert not torch.any(y)


@settings(max_examples=40, deadline=None)
@given(x=gradients(), name=st.sampled_from(LOSSY))
def test_feedback_residual_is_exactly_what_the_codec_lost(x, name):
    codec = codecs.get(name)
    n = codecs.padded_length(x.numel(), codec)
    # inside fp16's range with room for the residual (beyond 65504 fp16 is inf, and inf - inf is not a residual)
    corrected = torch.cat([x, x.new_zeros(n - x.numel())]).clamp(-60000, 60000)
    previous = torch.randn(n, generator=torch.Generator().manual_seed(n)) * corrected.abs().max() * 1e-3
    want = corrected + previous
    payload = codecs.empty_payload(codec, n)
    residual = codecs.encode_with_feedback(codec, corrected.clone(), previous.clone(), payload)
    decoded = codecs.decode(codec, payload, n)
    assert torch.allclose(decoded + residual, want, rtol=1e-6, atol=1e-30)


def test_dynamic_type_is_finer_than_linear_for_small_values():
    """The point of the dynamic type: values far below the block's absmax survive."""
    x = torch.full((1024,), 1e-4)
    x[0] = 1.0
    linear = codecs.decode(codecs.get("int8"), codecs.encode(codecs.get("int8"), x), 1024)
    dynamic = codecs.decode(codecs.get("int8-dynamic"), codecs.encode(codecs.get("int8-dynamic"), x), 1024)
    assert torch.all(linear[1:] == 0)  # 1e-4 is below half a linear level (1/254)
    assert torch.allclose(dynamic[1:], x[1:], rtol=0.15)  # 4 orders of magnitude down, within 15 %


def test_dynamic_encoding_picks_the_nearest_code():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50_176, generator=g) * torch.exp(torch.randn(50_176, generator=g) * 3)  # 7+ decades
    values = codecs.dynamic_map()
    codes, scale = codecs.encode(codecs.get("int8-dynamic"), x)
    normalised = (x.view(-1, codecs.BLOCK) / scale[:, None]).view(-1)
    brute = (normalised[:, None] - values[None, :]).abs().argmin(1)
    excess = (values[codes.long()] - normalised).abs() - (values[brute] - normalised).abs()
    assert excess.max() <= 2**-12 and (codes.long() != brute).float().mean() < 0.001


def test_payload_sizes():
    x = torch.randn(10 * codecs.BLOCK)
    for name, bytes_per_value in [("none", 4), ("fp16", 2), ("bf16", 2), ("int8", 1 + 4 / codecs.BLOCK),
                                  ("int8-dynamic", 1 + 4 / codecs.BLOCK)]:
        payload = codecs.encode(codecs.get(name), x)
        assert sum(t.numel() * t.element_size() for t in payload) == pytest.approx(bytes_per_value * x.numel())
        assert codecs.payload_bytes(codecs.get(name), x.numel()) == pytest.approx(bytes_per_value * x.numel())


@pytest.mark.parametrize("name", LOSSY)
def test_error_feedback_makes_the_sum_track_the_truth(name):
    codec = codecs.get(name)
    g = torch.Generator().manual_seed(0)
    n = 3072
    true_sum, sent_sum, plain_sum, residual = torch.zeros(n), torch.zeros(n), torch.zeros(n), None
    payload = codecs.empty_payload(codec, n)
    for _ in range(200):
        x = torch.randn(n, generator=g) * 1e-3 + 1e-5  # a small bias that plain rounding loses
        residual = codecs.encode_with_feedback(codec, x.clone(), residual, payload)
        true_sum += x
        sent_sum += codecs.decode(codec, payload, n)
        plain_sum += codecs.decode(codec, codecs.encode(codec, x), n)
    # With feedback the gap never grows beyond one step's error (it is the residual itself).
    assert torch.allclose(sent_sum + residual, true_sum, atol=1e-5)
    assert (sent_sum - true_sum).abs().max() <= (plain_sum - true_sum).abs().max() + 1e-7


def test_unknown_codec_names_the_choices():
    with pytest.raises(ValueError, match="int8-dynamic"):
        parse_method("int4")
    with pytest.raises(ValueError, match="positive integer"):
        parse_method("powersgd:0")


# -- PowerSGD's pure parts ------------------------------------------------------

def test_powersgd_compresses_only_matrices_that_gain():
    matrices, rest = powersgd.split([torch.Size([1200, 784]), torch.Size([1200]), torch.Size([10, 12]),
                                     torch.Size([32, 1, 3, 3]), torch.Size([32, 1, 5, 5])], rank=4)
    assert [(n, m) for _, n, m in matrices] == [(1200, 784), (32, 25)]  # 10x12 and 32x9 would not halve
    assert [numel for _, numel in rest] == [1200, 120, 288]
    assert powersgd.factor_values([torch.Size([1200, 784])], rank=4) == (1200 + 784) * 4


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 60), m=st.integers(1, 60), r=st.integers(1, 6), seed=st.integers(0, 1000))
def test_orthonormalize_gives_orthonormal_columns_spanning_p(n, m, r, seed):
    p = torch.randn(n, min(r, n), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    q = powersgd.orthonormalize(p.clone())
    assert torch.allclose(q.T @ q, torch.eye(q.shape[1], dtype=torch.float64), atol=1e-8)
    assert torch.allclose(q @ (q.T @ p), p, atol=1e-8)  # the same column space


def test_wire_bytes_follow_the_ring_rule():
    shapes = [torch.Size([1000, 1000])]
    for ranks in (2, 4, 8):
        plain = wire_bytes("none", shapes, ranks)
        assert plain == 2 * (ranks - 1) * 4_000_000 // ranks
        # compressed: 2(P-1) chunks of a quarter the size (plus scales and block padding)
        assert wire_bytes("int8", shapes, ranks) == pytest.approx(plain / 4, rel=0.02)
        assert wire_bytes("fp16", shapes, ranks) == pytest.approx(plain / 2, rel=1e-6)
        assert wire_bytes("powersgd:4", shapes, ranks) == 2 * (ranks - 1) * 4 * 8000 // ranks
    assert chunk_length(1_000_000, 3, codecs.get("int8")) % codecs.BLOCK == 0


def test_switching_methods_keeps_what_the_average_owes():
    state = FeedbackState(sent=torch.zeros(8), owned=torch.full((4,), 0.5))
    switch_method(state, "int8", "none", rank=1, ranks=2)
    assert torch.equal(state.sent, torch.tensor([0, 0, 0, 0, 1.0, 1.0, 1.0, 1.0]))
    assert state.owned is None


# -- auto's model ------------------------------------------------------------------

GBIT = 125e6  # bytes per second


def mlp_buckets(lead_first=0.006):
    """The source's MLP in gpurig's 4 MB buckets: layers 3+2 (1.45 M values) leave early, layer 1 (0.94 M) last."""
    def bucket(values, lead, matrix_values):
        n = values
        return auto.Bucket(lead, {"none": 4 * n, "fp16": 2 * n, "int8": n, "powersgd": 4 * matrix_values},
                           {"none": 1, "fp16": 2, "int8": 2, "powersgd": 2},
                           {"none": 0.0, "fp16": 1.5e-9 * n, "int8": 3e-9 * n, "powersgd": 2e-3})
    return [bucket(1_453_210, lead_first, 12_000), bucket(942_000, 0.0, 8_000)]


@pytest.mark.parametrize("gbit,expected", [(0.1, "powersgd"), (1, "powersgd"), (40, "none"), (100, "none")])
def test_the_model_compresses_behind_slow_links_and_not_on_fast_ones(gbit, expected):
    methods, predicted = auto.choose(mlp_buckets(), auto.Network(1e-4, gbit * GBIT), codec_on_cores=True,
                                     candidates=("none", "fp16", "int8", "powersgd"))
    assert expected in methods, (methods, predicted)
    if expected == "none":
        assert methods == ["none", "none"]
    assert predicted["chosen_ms"] <= predicted["none_ms"]


def test_auto_picks_powersgd_at_1_gbit_and_int8_when_told_to_leave_it_out():
    assert auto.CANDIDATES == ("none", "fp16", "int8", "powersgd")  # least lossy first
    methods, _ = auto.choose(mlp_buckets(), auto.Network(1e-4, GBIT), True)
    assert methods == ["powersgd", "powersgd"]
    methods, _ = auto.choose(mlp_buckets(), auto.Network(1e-4, GBIT), True, auto.parse("auto:int8,fp16"))
    assert methods == ["int8", "int8"]


@pytest.mark.parametrize("gbit", [0.1, 2])
def test_auto_gives_back_little_time_for_precision(gbit):
    """A less lossy method is kept only where it costs a tenth of the remaining wait: not int8's 80 ms for
    PowerSGD's 7 behind 100 Mbit/s."""
    methods, predicted = auto.choose(mlp_buckets(), auto.Network(1e-4, gbit * GBIT), True)
    assert methods == ["powersgd", "powersgd"], (methods, predicted)
    assert predicted["chosen_ms"] <= 1.1 * predicted["fastest_ms"] + 0.5


def test_auto_leaves_a_bucket_hidden_under_backward_uncompressed():
    for candidates, last in ((auto.CANDIDATES, "powersgd"), (auto.parse("auto:fp16,int8"), "int8")):
        methods, _ = auto.choose(mlp_buckets(lead_first=1.0), auto.Network(1e-4, GBIT), True, candidates)
        assert methods == ["none", last]  # the first bucket has a second of backward to hide behind


def test_auto_shortlists_what_its_model_cannot_tell_apart():
    net = auto.Network(1e-4, 5 * GBIT)  # fp16, int8 and PowerSGD within a few ms of each other
    chosen, _ = auto.choose(mlp_buckets(), net, True)
    listed = auto.shortlist(mlp_buckets(), net, True, chosen)
    assert listed[0] == chosen and 1 < len(listed) <= 3 and len({tuple(m) for m in listed}) == len(listed), listed
    predicted = [auto.exposed_seconds(mlp_buckets(), m, net, True) for m in listed]
    assert max(predicted) <= 1.5 * min(predicted) + auto.MIN_SAVING_S, (listed, predicted)
    # far apart (PowerSGD's 5 ms against int8's 20 behind 1 Gbit/s), or nothing to gain: nothing to time
    one_gbit = auto.Network(1e-4, GBIT)
    assert auto.shortlist(mlp_buckets(), one_gbit, True, ["powersgd"] * 2) == [["powersgd"] * 2]
    assert auto.shortlist(mlp_buckets(), auto.Network(1e-4, 40 * GBIT), True, ["none"] * 2) == [["none"] * 2]


@pytest.mark.parametrize("text,candidates", [
    ("auto", ("none", "fp16", "int8", "powersgd")),
    ("auto:int8", ("none", "int8")),
    ("auto:powersgd:2,bf16, int8", ("none", "bf16", "int8", "powersgd:2")),
    ("int8", None), ("none", None), ("automatic", None),
])
def test_auto_names_its_candidates(text, candidates):
    assert auto.parse(text) == candidates


@pytest.mark.parametrize("text", ["auto:", "auto:int4", "auto:int8,,fp16", "auto:powersgd:0"])
def test_auto_with_an_unknown_method_is_refused(text):
    with pytest.raises(ValueError, match="compression 'auto:"):
        auto.parse(text)


@settings(max_examples=50, deadline=None)
@given(gbit=st.floats(0.01, 1000), lead=st.floats(0, 0.1))
def test_fitted_bandwidth_reproduces_the_measured_wait(gbit, lead):
    buckets = mlp_buckets(lead)
    truth = auto.Network(2e-4, gbit * GBIT)
    waited = auto.exposed_seconds(buckets, ["none", "none"], truth, True)
    fitted = auto.fit_bandwidth(buckets, ["none", "none"], 2e-4, waited, True)
    again = auto.exposed_seconds(buckets, ["none", "none"], auto.Network(2e-4, fitted), True)
    assert math.isclose(again, waited, rel_tol=1e-3, abs_tol=1e-7)
    if waited > 1e-6:
        assert math.isclose(fitted, truth.bandwidth, rel_tol=1e-2)


def _int8_both_ways(x, residual):
    """(codes, scale, new residual, x after) from the C kernel and from the torch functions, for one input."""
    results = []
    for use_native in (True, False):
        xx, rr = x.clone(), residual.clone()
        payload = codecs.empty_payload(codecs.get("int8"), x.numel())
        if use_native:
            native.library().int8_encode_feedback(xx.data_ptr(), rr.data_ptr(), 1, payload[0].data_ptr(),
                                                  payload[1].data_ptr(), x.numel(), codecs.BLOCK,
                                                  codecs._SMALLEST_SCALE)
        else:
            xx.add_(rr)
            levels = codecs._int8_levels(xx, payload)
            rr = xx - (levels * (payload[1] / 127)[:, None]).view(-1)
        results.append((*payload, rr, xx))
    return results


@pytest.mark.skipif(native.library() is None, reason="no C compiler here: the torch functions are used")
@settings(max_examples=40, deadline=None)
@given(x=gradients())
def test_native_int8_gives_the_torch_codes_and_scales(x):
    """The C kernel is a faster way to the same payload: codes and scales equal, residuals equal to rounding."""
    n = codecs.padded_length(x.numel(), codecs.get("int8"))
    x = torch.cat([x, x.new_zeros(n - x.numel())])
    residual = torch.randn(n, generator=torch.Generator().manual_seed(n)) * x.abs().max() * 1e-3
    (codes, scale, res, after), (codes_t, scale_t, res_t, after_t) = _int8_both_ways(x, residual)
    assert torch.equal(codes, codes_t) and torch.equal(scale, scale_t) and torch.equal(after, after_t)
    assert torch.allclose(res, res_t, rtol=1e-6, atol=1e-30 + 1e-6 * scale.max().item())
    out, out_t = torch.empty(n), torch.empty(n)
    codecs.get("int8").decode((codes, scale), out)  # the C decode
    out_t.copy_(codes).view(-1, codecs.BLOCK).mul_((scale / 127)[:, None])
    assert torch.equal(out, out_t)


@pytest.mark.skipif(native.library() is None, reason="no C compiler here: the torch functions are used")
def test_native_int8_lets_nan_and_inf_through_to_the_scale():
    """A NaN or Inf in a block makes its scale non-finite, as with torch.amax, so the numerical guard sees it."""
    for bad in (float("nan"), float("inf"), -float("inf")):
        x = torch.randn(3 * codecs.BLOCK)
        x[codecs.BLOCK + 5] = bad
        (codes, scale, *_), _ = _int8_both_ways(x, torch.zeros_like(x))
        assert torch.isfinite(scale[0]) and not torch.isfinite(scale[1]) and torch.isfinite(scale[2]), (bad, scale)


@pytest.mark.skipif(native.library() is None, reason="no C compiler here: the torch functions are used")
@pytest.mark.parametrize("name", ["fp16", "bf16"])
@settings(max_examples=30, deadline=None)
@given(x=gradients(), add=st.booleans())
def test_native_16_bit_casts_give_the_torch_payload_and_residual(name, x, add):
    """The 16-bit casts' C kernels (one pass): the torch cast's values, residual and corrected input, bit for bit
    (NaN where torch has NaN), also past fp16's range and on lengths that are not a multiple of 8. (Where the
    compiler has no _Float16, fp16 is cast by torch on both sides.)"""
    codec = codecs.get(name)
    x = torch.cat([x, torch.tensor([float("nan"), float("inf"), -float("inf"), 65519.0, 65520.0, -1e6, 3e-8])])
    residual = torch.randn(x.numel(), generator=torch.Generator().manual_seed(x.numel())) * 1e-3
    got, want = codecs.empty_payload(codec, x.numel()), codecs.empty_payload(codec, x.numel())
    x_got, x_want = x.clone(), x.clone()
    r_got = codecs.encode_with_feedback(codec, x_got, residual.clone() if add else None, got)
    if add:
        x_want.add_(residual)
    r_want = codecs._encode_then_subtract(codec.encode, codec.decode, x_want, torch.empty_like(x), want)
    for a, b in ((got[0].float(), want[0].float()), (r_got, r_want), (x_got, x_want)):
        assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))


def test_without_the_kernels_the_codec_falls_back_to_torch(monkeypatch, tmp_path):
    """GPURIG_NATIVE=0 (or no compiler) gives no library; encoding still works, through torch."""
    monkeypatch.setenv("GPURIG_NATIVE", "0")
    assert native._load() is None
    monkeypatch.setattr(native, "_loaded", [None])
    x = torch.randn(4096)
    payload = codecs.empty_payload(codecs.get("int8"), 4096)
    residual = codecs.encode_with_feedback(codecs.get("int8"), x.clone(), None, payload)
    assert torch.allclose(codecs.decode(codecs.get("int8"), payload, 4096) + residual, x, atol=1e-6)
    monkeypatch.delenv("GPURIG_NATIVE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    if native.compiler() is not None:  # a fresh cache directory: built there, atomically, once
        assert native._load() is not None and len(list((tmp_path / "gpurig").glob("int8-*.so"))) == 1


@pytest.mark.skipif(native.library() is None, reason="no C compiler here: the torch functions are used")
@settings(max_examples=30, deadline=None)
@given(x=gradients())
def test_native_dynamic_type_gives_the_torch_codes_and_scales(x):
    """The 8-bit dynamic type's C kernel: the same nearest codes and scales as the torch table lookup."""
    codec = codecs.get("int8-dynamic")
    n = codecs.padded_length(x.numel(), codec)
    x = torch.cat([x, x.new_zeros(n - x.numel())])
    residual = torch.randn(n, generator=torch.Generator().manual_seed(n)) * x.abs().max() * 1e-3
    native_payload, torch_payload = codecs.empty_payload(codec, n), codecs.empty_payload(codec, n)
    native_residual = codecs.encode_with_feedback(codec, x.clone(), residual.clone(), native_payload)
    corrected = x + residual
    codecs._encode_dynamic(corrected, torch_payload)
    assert torch.equal(native_payload[0], torch_payload[0]) and torch.equal(native_payload[1], torch_payload[1])
    decoded = codecs.decode(codec, native_payload, n)  # the C decode
    reference = torch.index_select(codecs._map(torch.device("cpu")), 0, torch_payload[0].int()).view(-1, codecs.BLOCK)
    assert torch.equal(decoded, (reference * torch_payload[1][:, None]).view(-1))
    assert torch.allclose(native_residual, corrected - decoded, rtol=1e-6, atol=1e-30)


def dynamic_edge_block() -> torch.Tensor:
    """One block of the values the 8-bit dynamic type's arithmetic must get right: its absmax (1.0), every
    midpoint between neighbouring codes and the floats either side of it, ±0, the smallest magnitudes."""
    values = codecs.dynamic_map()
    magnitudes = values[values >= 0]
    midpoints = (magnitudes[1:] + magnitudes[:-1]) * 0.5
    edges = torch.cat([midpoints, torch.nextafter(midpoints, torch.tensor(2.0)),
                       torch.nextafter(midpoints, torch.tensor(0.0)), magnitudes,
                       torch.tensor([0.0, -0.0, 1e-30, 1e-40, 2.75e-7, 1e-7])])
    block = torch.cat([edges, -edges[:300]])[: codecs.BLOCK - 1]
    block = torch.cat([torch.tensor([1.0]), block, block.new_zeros(codecs.BLOCK - 1 - block.numel())])
    return block


def test_dynamic_type_edges_go_to_the_nearest_code():
    """Every midpoint between two codes, and the floats either side of it, goes to a nearest code: a float
    within two ulps of a midpoint to either side (the slots' arithmetic puts its bin edges there, its constants
    being float32), every other to the nearer; 1.0 is exact; zero stays zero; a negative absmax takes the most
    negative code (the type has no -1.0)."""
    codec = codecs.get("int8-dynamic")
    x = dynamic_edge_block()
    values = codecs.dynamic_map().double()
    for block in (x, -x):
        codes, scale = codecs.encode(codec, block)
        assert scale.item() == 1.0
        distance = (values[None, :] - block.double()[:, None]).abs()
        excess = distance[torch.arange(codecs.BLOCK), codes.long()] - distance.min(1).values
        ulp = (torch.nextafter(block.abs(), torch.tensor(2.0)) - block.abs()).double()
        assert torch.all(excess <= 4 * ulp)  # the distance moves two ulps for each ulp of the value
    assert codecs.encode(codec, x)[0][0] == 255 and codecs.encode(codec, -x)[0][0] == 0
    assert torch.all(codecs.decode(codec, codecs.encode(codec, x), codecs.BLOCK)[x == 0] == 0)


@pytest.mark.skipif(native.library() is None, reason="no C compiler here: the torch functions are used")
@pytest.mark.parametrize("block", [codecs.BLOCK, 40, 7])
def test_native_dynamic_kernel_agrees_with_torch_on_edges_nan_and_inf(block, monkeypatch):
    """The C kernel's vector path (32 values at a time) and its per-value path (a block's remainder, and what
    machines without AVX2 run) give torch's codes, scales and residuals, NaN and infinity included."""
    monkeypatch.setattr(codecs, "BLOCK", block)
    edges = dynamic_edge_block()
    special = torch.tensor([float("nan"), -float("nan"), float("inf"), -float("inf"), 3.0, -5.0, 1e-38])
    x = torch.cat([edges[: 29 * block], edges[: block] * 1e-20, -edges[: block], special[: block]])
    x = torch.cat([x, x.new_zeros(-x.numel() % block)])
    codec = codecs.get("int8-dynamic")
    payload, reference = codecs.empty_payload(codec, x.numel()), codecs.empty_payload(codec, x.numel())
    residual = x.new_zeros(x.numel())
    native.library().dynamic_encode_feedback(
        x.data_ptr(), residual.data_ptr(), 0, payload[0].data_ptr(), payload[1].data_ptr(), x.numel(), block,
        codecs._SMALLEST_SCALE, codecs._tables(x.device).data_ptr())
    codecs._encode_dynamic(x, reference)
    assert torch.equal(payload[0], reference[0])
    assert torch.equal(payload[1].nan_to_num(7.0), reference[1].nan_to_num(7.0))
    decoded = torch.empty_like(x)
    codecs._decode_dynamic(payload, decoded)
    by_torch = (codecs.dynamic_map()[payload[0].long()].view(-1, block) * payload[1][:, None]).view(-1)
    assert torch.equal(decoded.nan_to_num(7.0), by_torch.nan_to_num(7.0))
    finite = torch.isfinite(x) & torch.isfinite(decoded)
    assert torch.equal(residual[finite], (x - decoded)[finite])
