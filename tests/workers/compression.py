"""Compressed averaging and compressed DataParallel on real ranks."""

import torch
import torch.nn.functional as F

import gpurig
from casekit import case, write
from gpurig.parallel import codecs
from gpurig.parallel.compression import FeedbackState, compressed_average

comm = gpurig.init()
R, P = comm.rank, comm.size
LOSSY = ["fp16", "bf16", "int8", "int8-dynamic"]


def gradient(seed, n=5000):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


for name in LOSSY:
    @case(f"compressed_average_is_close[{name}]")
    def _():
        x = gradient(R)
        true = sum(gradient(r) for r in range(P)) / P
        average, sent = compressed_average(comm, x, codecs.get(name), FeedbackState())
        scale = max(gradient(r).abs().max() for r in range(P))
        assert (average - true).abs().max() <= 0.05 * scale, (average - true).abs().max()
        assert torch.equal(comm.allgather(average.view(1, -1)), average.expand(P, -1))  # identical everywhere
        full = 2 * (P - 1) * 5000 * 4 // P
        assert sent < full * codecs.get(name).bits_per_value / 32 * 1.3, (sent, full)

    @case(f"feedback_tracks_the_true_sum[{name}]")
    def _():
        state, sent_sum, true_sum = FeedbackState(), torch.zeros(3000), torch.zeros(3000)
        for step in range(30):
            x = gradient(1000 * step + R, 3000) * 1e-3 + 1e-4
            average, _ = compressed_average(comm, x, codecs.get(name), state)
            sent_sum += average
            true_sum += sum(gradient(1000 * step + r, 3000) * 1e-3 + 1e-4 for r in range(P)) / P
        # what is still owed sits in the residuals, at most one step's rounding
        assert (sent_sum - true_sum).abs().max() < 3e-4, (sent_sum - true_sum).abs().max()

    @case(f"compressed_data_parallel_trains_like_single_process[{name}]")
    def _():
        def mlp():
            torch.manual_seed(0)
            return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))

        g = torch.Generator().manual_seed(7)
        batches = [(torch.randn(24 * P, 20, generator=g), torch.randint(0, 5, (24 * P,), generator=g)) for _ in range(5)]
        reference, dp = mlp(), gpurig.DataParallel(mlp(), compression=name, bucket_cap_mb=0.001)
        opt_ref, opt = torch.optim.SGD(reference.parameters(), lr=0.1), torch.optim.SGD(dp.parameters(), lr=0.1)
        for x, y in batches:
            opt_ref.zero_grad()
            F.cross_entropy(reference(x), y).backward()
            opt_ref.step()
            opt.zero_grad()
            F.cross_entropy(dp(torch.tensor_split(x, P)[R]), torch.tensor_split(y, P)[R]).backward()
            opt.step()
        for p, q in zip(dp.parameters(), reference.parameters()):
            assert (p - q).abs().max() < 0.01, (p - q).abs().max()
        assert len(dp.buckets) > 1 and dp.stats.bytes_sent > 0
        state = dp.compression_state_dict()
        assert state["codec"] == name and all(b["sent"] is not None for b in state["buckets"])


@case("compression_state_roundtrip_and_mismatch")
def _():
    dp = gpurig.DataParallel(torch.nn.Linear(4, 2), compression="int8")
    dp(torch.ones(2, 4)).sum().backward()
    state = dp.compression_state_dict()
    dp.load_compression_state_dict(state)
    try:
        gpurig.DataParallel(torch.nn.Linear(4, 2), compression="fp16").load_compression_state_dict(state)
    except ValueError as e:
        assert "does not fit" in str(e)
    else:
        raise AssertionError("no error")


write(R)
