"""Compressed averaging and compressed DataParallel on real ranks."""

import copy

import torch
import torch.nn.functional as F

import gpurig
from casekit import case, write
from gpurig.parallel import codecs, compression
from gpurig.parallel.compression import (PIECE_BYTES, FeedbackState, average, compressed_average, switch_method,
                                         wire_bytes)

comm = gpurig.init()
R, P = comm.rank, comm.size
LOSSY = ["fp16", "bf16", "int8", "int8-dynamic"]
METHODS = LOSSY + ["powersgd:2"]
SHAPES = [torch.Size([60, 50]), torch.Size([60]), torch.Size([5, 60]), torch.Size([5])]  # a small MLP's grads
N = sum(s.numel() for s in SHAPES)


def gradient(seed, n=N):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def low_rank_gradient(seed):
    """What real weight gradients look like: a few outer products (batch size ≪ layer width) plus noise."""
    g = torch.Generator().manual_seed(seed)
    parts = []
    for shape in SHAPES:
        if len(shape) == 2:
            parts.append((torch.randn(shape[0], 2, generator=g) @ torch.randn(2, shape[1], generator=g)).view(-1))
        else:
            parts.append(torch.randn(shape[0], generator=g))
    return torch.cat(parts) + 1e-3 * torch.randn(N, generator=g)


def identical_everywhere(t):
    return torch.equal(comm.allgather(t.view(1, -1)), t.view(1, -1).expand(P, -1))


for name in LOSSY:
    @case(f"compressed_average_is_close[{name}]")
    def _():
        x = gradient(R, 5000)
        true = sum(gradient(r, 5000) for r in range(P)) / P
        sent = compressed_average(comm, x, codecs.get(name), FeedbackState())
        scale = max(gradient(r, 5000).abs().max() for r in range(P))
        assert (x - true).abs().max() <= 0.05 * scale, (x - true).abs().max()
        assert identical_everywhere(x)
        assert sent == wire_bytes(name, [torch.Size([5000])], P)
        assert sent < 2 * (P - 1) * 5000 * 4 // P * codecs.get(name).bits_per_value / 32 * 1.3


@case("powersgd_is_exact_on_low_rank_gradients")
def _():
    # Every rank's gradient lies in the same rank-2 column and row spaces (a fixed direction whose size
    # changes from step to step): rank-2 PowerSGD recovers the average, step after step.
    g = torch.Generator().manual_seed(5)
    left = [torch.randn(s[0], 2, generator=g) for s in SHAPES]
    right = [torch.randn(2, s.numel() // s[0], generator=g) for s in SHAPES]
    weights = [torch.randn(2, 2, generator=torch.Generator().manual_seed(9 + r)) for r in range(P)]
    state = FeedbackState()
    for step in range(3):
        def gradient_of(r):
            return torch.cat([(a @ weights[r] @ b).view(-1) if len(s) == 2 else (a @ weights[r] @ b)[:, 0]
                              for a, b, s in zip(left, right, SHAPES)]) * (step + 1)
        x, true = gradient_of(R), sum(gradient_of(r) for r in range(P)) / P
        sent = average(comm, x, "powersgd:2", state, SHAPES)
        assert identical_everywhere(x)
        assert (x - true).abs().max() < 1e-4 * true.abs().max(), (step, (x - true).abs().max())
    assert sent == wire_bytes("powersgd:2", SHAPES, P) < wire_bytes("none", SHAPES, P) / 2


for name in METHODS:
    @case(f"feedback_tracks_the_true_sum[{name}]")
    def _():
        """Sum of averages + the ranks' mean residual = sum of true averages, exactly (up to rounding)."""
        state, sent_sum, true_sum = FeedbackState(), torch.zeros(N), torch.zeros(N)
        for step in range(30):
            x = low_rank_gradient(1000 * step + R) * 1e-3 + 1e-4
            average(comm, x, name, state, SHAPES)
            sent_sum += x
            true_sum += sum(low_rank_gradient(1000 * step + r) * 1e-3 + 1e-4 for r in range(P)) / P
        owed = state.sent[:N].clone()
        if state.owned is not None:  # the owner's residual is debt of the average of its chunk
            chunk = state.owned.numel()
            owed[R * chunk: (R + 1) * chunk] += (P * state.owned)[: max(0, min(chunk, N - R * chunk))]
        owed = comm.allreduce(owed, op="average")
        assert torch.allclose(sent_sum + owed, true_sum, atol=2e-6), (sent_sum + owed - true_sum).abs().max()

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
        tolerance = 0.05 if name.startswith("powersgd") else 0.01  # rank 2 of a 64-wide layer: a coarser step
        for p, q in zip(dp.parameters(), reference.parameters()):
            assert (p - q).abs().max() < tolerance, (p - q).abs().max()
            assert identical_everywhere(p.detach())
        assert len(dp.buckets) > 1 and dp.stats.bytes_sent > 0 and dp.methods == [name] * len(dp.buckets)
        state = dp.compression_state_dict()
        assert state["compression"] == name and all(b["sent"] is not None for b in state["buckets"])


for name in METHODS:
    @case(f"resume_from_saved_state_is_exact[{name}]")
    def _():
        """Save model, optimizer and compression state mid-run; a fresh wrapper that loads them ends bit-identical."""
        def mlp():
            torch.manual_seed(0)
            return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))

        g = torch.Generator().manual_seed(11)
        batches = [(torch.randn(16, 20, generator=g), torch.randint(0, 5, (16,), generator=g)) for _ in range(8)]

        def steps(dp, opt, part):
            for x, y in part:
                opt.zero_grad()
                F.cross_entropy(dp(x), y).backward()
                opt.step()

        dp = gpurig.DataParallel(mlp(), compression=name, bucket_cap_mb=0.001)
        opt = torch.optim.SGD(dp.parameters(), lr=0.1, momentum=0.9)
        steps(dp, opt, batches[:4])
        saved = [copy.deepcopy(x) for x in (dp.state_dict(), opt.state_dict(), dp.compression_state_dict())]
        steps(dp, opt, batches[4:])
        again = gpurig.DataParallel(mlp(), compression=name, bucket_cap_mb=0.001)
        again.load_state_dict(saved[0])
        opt2 = torch.optim.SGD(again.parameters(), lr=0.1, momentum=0.9)
        opt2.load_state_dict(saved[1])
        again.load_compression_state_dict(saved[2])
        steps(again, opt2, batches[4:])
        for p, q in zip(dp.parameters(), again.parameters()):
            assert torch.equal(p, q), (p - q).abs().max()


@case("pieces_change_nothing_but_how_the_bytes_travel")
def _():
    """Cut into many pieces (a pipeline of collectives) or sent whole, the average is bit-identical."""
    for name in LOSSY:
        results = []
        for piece_bytes in (1 << 30, 2000):
            compression.PIECE_BYTES = piece_bytes
            try:
                x, state = gradient(R, 20_000), FeedbackState()
                for _ in range(2):  # the second step uses the residuals the first left
                    sent = compressed_average(comm, x, codecs.get(name), state, name="t")
                results.append((x, state.sent, state.owned, sent))
            finally:
                compression.PIECE_BYTES = PIECE_BYTES
        (one, *_), (many, *_) = results
        assert len(compression.piece_bounds(20_000 // P, codecs.get(name))) == 1
        assert all(torch.equal(a, b) for a, b in zip(results[0][:3], results[1][:3])), name
        assert results[0][3] == results[1][3] == wire_bytes(name, [torch.Size([20_000])], P)


@case("overlapped_buckets_average_as_one_bucket_at_a_time")
def _():
    """DataParallel begins each compressed bucket before finishing the one before, with plain and PowerSGD
    buckets between them: every bucket still gets exactly the average it would get alone, and the step's
    collectives, PowerSGD's allreduces among them, are checked against the other ranks' in one exchange."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Linear(40, 40) for _ in range(6)])
    dp = gpurig.DataParallel(copy.deepcopy(net), compression="int8", bucket_cap_mb=0.004)
    methods = (["int8", "fp16", "none", "int8", "powersgd:2", "int8"] * 3)[: len(dp.buckets)]
    for bucket, method in zip(dp.buckets, methods):
        bucket.method = method
    compression.PIECE_BYTES = 1500  # several pieces per bucket
    # every check: one exchange (Guard._exchange), or one begun nonblocking at backward's first gradient
    exchanges, exchange, post = [], comm.guard._exchange, comm.guard.post_expect
    comm.guard._exchange = lambda signatures, first: (exchanges.append(len(signatures)), exchange(signatures, first))
    comm.guard.post_expect = lambda signatures: (exchanges.append(len(signatures)), post(signatures))[1]
    try:
        states = [FeedbackState() for _ in dp.buckets]
        for step in range(3):
            x = torch.randn(8, 40, generator=torch.Generator().manual_seed(100 * step + R))
            dp.zero_grad()
            checked = len(exchanges)
            dp(x).sum().backward()
            # one exchange announcing every collective of the step: each was submitted as announced
            assert len(exchanges) == checked + 1 and exchanges[-1] > len(dp.buckets), exchanges[checked:]
            assert not comm.guard._expected
            net.zero_grad()
            net(x).sum().backward()
            for bucket, method, state in zip(dp.buckets, methods, states):
                flat = torch.zeros_like(bucket.flat)
                own = dict(zip(map(id, dp.module.parameters()), net.parameters()))
                for p, start in zip(bucket.params, bucket.offsets):
                    flat[start: start + p.numel()] = own[id(p)].grad.reshape(-1)
                if method == "none":
                    flat[: bucket.numel] = comm.allreduce(flat[: bucket.numel] * (1 / P), op="sum")  # as DDP
                else:
                    average(comm, flat, method, state, bucket.shapes)
                for p, start in zip(bucket.params, bucket.offsets):
                    assert torch.equal(p.grad.reshape(-1), flat[start: start + p.numel()]), (step, method)
            with torch.no_grad():  # keep both models equal for the next step
                for p, q in zip(dp.module.parameters(), net.parameters()):
                    q.copy_(p)
        assert len(set(methods)) == 4 and dp._in_flight is None
    finally:
        compression.PIECE_BYTES = PIECE_BYTES
        comm.guard._exchange = exchange
        del comm.guard.post_expect  # the instance's wrapper: the class's method again


@case("compression_state_roundtrip_and_mismatch")
def _():
    dp = gpurig.DataParallel(torch.nn.Linear(40, 30), compression="powersgd")
    dp(torch.ones(2, 40)).sum().backward()
    state = dp.compression_state_dict()
    assert state["buckets"][0]["lowrank"] is not None
    fresh = gpurig.DataParallel(torch.nn.Linear(40, 30), compression="powersgd")
    fresh.load_compression_state_dict(state)
    assert torch.equal(fresh.buckets[0].state.lowrank[0], dp.buckets[0].state.lowrank[0])
    try:
        gpurig.DataParallel(torch.nn.Linear(40, 30), compression="fp16").load_compression_state_dict(state)
    except ValueError as e:
        assert "the residuals were saved by compression 'powersgd', this model sends 'fp16'" in str(e), e
    else:
        raise AssertionError("no error")


@case("an_fp16_overflow_names_the_codec_not_only_the_gradient")
def _():
    dp = gpurig.DataParallel(torch.nn.Linear(4, 1, bias=False), compression="fp16")
    try:  # every rank's gradient is 70000: finite, as is their average, but past fp16's largest value (65504)
        (70000.0 * dp(torch.ones(1, 4)).sum()).backward()
    except gpurig.NonFiniteGradientError as e:
        assert "it travelled as fp16, whose largest value is 65504" in str(e), e
    else:
        raise AssertionError("an fp16 overflow was not stopped")
    dp.remove_hooks()
    dp = gpurig.DataParallel(torch.nn.Linear(4, 1, bias=False), compression="fp16")
    try:  # a NaN was NaN before it travelled: fp16's range is not why
        (float("nan") * dp(torch.ones(1, 4)).sum()).backward()
    except gpurig.NonFiniteGradientError as e:
        assert "holds NaN" in str(e) and "travelled as fp16" not in str(e), e
    else:
        raise AssertionError("a NaN gradient was not stopped")
    dp.remove_hooks()


def small_auto_model(compression: str):
    """A two-layer net in many small buckets under ``compression`` ("auto..."), and its optimizer."""
    torch.manual_seed(0)
    dp = gpurig.DataParallel(torch.nn.Sequential(torch.nn.Linear(200, 300), torch.nn.ReLU(), torch.nn.Linear(300, 10)),
                             compression=compression, bucket_cap_mb=0.01)
    return dp, torch.optim.SGD(dp.parameters(), lr=0.01)


def train_step(dp, opt) -> None:
    # a loss bounded below: the sum of the outputs, which these cases trained on before, grows without end, and
    # after enough steps (how many depends on the machine's speed through auto's trials) fp16 buckets overflowed
    opt.zero_grad()
    dp(torch.randn(16, 200)).square().mean().backward()
    opt.step()


def assert_every_rank_agrees(dp, choice) -> None:
    assert len(set(comm.allgather_bytes(repr(choice).encode()))) == 1  # the same numbers, the same choice
    for p in dp.parameters():  # and training went on in step everywhere
        assert identical_everywhere(p.detach())


@case("auto_decides_once_calibrated_and_every_rank_agrees")
def _():
    dp, opt = small_auto_model("auto:fp16,int8")
    for step in range(10):
        train_step(dp, opt)
        if step < 5:
            assert dp.auto_choice is None and set(dp.methods) == {"none"}
    for _ in range(60):  # the shortlist's trials (their number depends on the timings) end at the same step everywhere
        if not dp._trials:
            break
        train_step(dp, opt)
    choice = dp.auto_choice
    assert not dp._trials and choice["step"] == 6 and choice["methods"] == dp.methods and len(dp.methods) == len(dp.buckets) > 1
    assert set(dp.methods) <= {"none", "fp16", "int8"}, choice  # only what it was told it may choose
    assert choice["chosen_ms"] <= choice["none_ms"] + 1e-9, choice
    assert_every_rank_agrees(dp, choice)


@case("auto_resumed_before_its_choice_calibrates_on_its_own_steps")
def _():
    """A run checkpointed at step 5, before auto chose (gpurig train --checkpoint-every 5), resumes and goes on."""
    dp, opt = small_auto_model("auto:fp16,int8")
    for _ in range(5):
        train_step(dp, opt)
    saved = dp.compression_state_dict()
    dp.remove_hooks()
    dp, opt = small_auto_model("auto:fp16,int8")
    dp.load_compression_state_dict(saved)
    for step in range(6):        # it crashed here: 5 steps counted, none of them seen by this process
        train_step(dp, opt)
        assert (dp.auto_choice is None) == (step < 5), (step, dp.auto_choice)
    assert dp.auto_choice["step"] == 11
    assert_every_rank_agrees(dp, dp.auto_choice)


@case("auto_times_its_shortlist_in_real_steps_and_every_rank_keeps_the_same")
def _():
    dp, opt = small_auto_model("auto")
    # as if the model had shortlisted two assignments at step 0: each is trained on for a few steps, timed
    shortlist = [["int8"] * len(dp.buckets), ["powersgd:2"] * len(dp.buckets)]
    dp.auto_choice = {"methods": shortlist[0], "step": 0}
    dp._set_methods(shortlist[0])
    dp._trials, dp._trial_times = shortlist, [[]]
    seen = []
    for step in range(2 * 4 + 4):
        train_step(dp, opt)
        seen.append(list(dp.methods))
        if step == 1:  # a checkpoint in the middle of the first trial: resumed, the trials start again
            saved = dp.compression_state_dict()
            dp.load_compression_state_dict(saved)
            assert saved["trials"] == shortlist and dp._trial_times == [[]]
            seen = []
    assert seen[:3] == [shortlist[0]] * 3 and seen[3:7] == [shortlist[1]] * 4, seen  # 4 steps each
    choice = dp.auto_choice
    assert [t["methods"] for t in choice["trials"]] == shortlist and all(t["ms"] > 0 for t in choice["trials"])
    assert choice["methods"] in shortlist and seen[-1] == choice["methods"] and not dp._trials
    fastest = min(choice["trials"], key=lambda t: t["ms"])
    if choice["methods"] != shortlist[0]:  # the model's choice is left only for one measured faster
        assert fastest["methods"] == choice["methods"] and fastest["ms"] * 1.03 < choice["trials"][0]["ms"]
    assert_every_rank_agrees(dp, choice)


@case("auto_does_not_read_a_slow_rank_as_a_slow_link")
def _():
    """Once auto's choice has settled, one rank turning slow (100 ms more backward each step, deterministic)
    makes the others wait at backward's end, but not for the link: the review takes the wait of the rank
    that finished last, a few ms, so auto does not decide again (reading rank 0's wait, ~100 ms, it would at
    the 2nd review). What each review read is recorded: on a loaded machine the last rank's own wait may still
    move by a few ms, and a decision that follows from that is not this case's."""
    import time

    from gpurig.parallel import auto

    slow_s = 0.1
    dp, opt = small_auto_model("auto:fp16,int8")
    dp.auto_review_steps = 2
    for _ in range(40):
        train_step(dp, opt)
        if dp._settled_s is not None:
            break
    assert dp._settled_s is not None and not dp._trials, dp.auto_choice
    decisions = dp.auto_choice["decisions"]
    reviews, drifted = [], auto.drifted  # (settled, reviewed wait) of each review from here on
    auto.drifted = lambda settled, recent: (reviews.append((settled, recent)), drifted(settled, recent))[1]
    if R == 1:
        dp.module[0].weight.register_hook(lambda grad: time.sleep(slow_s))
    waits = []
    try:
        for _ in range(12):  # reviews every 2 steps; from the 6th step on the window holds only slow steps
            train_step(dp, opt)
            waits.append(dp.stats.last_exposed_s)
    finally:
        auto.drifted = drifted
    if R == 0:  # the others did wait for rank 1: the slowdown was real
        assert sorted(waits)[len(waits) // 2] > 0.6 * slow_s, waits
    # every review read the wait of the rank that finished last, never the ~100 ms the others waited
    assert len(reviews) >= 3 and max(wait for _, wait in reviews) < slow_s / 2, reviews
    if not any(drifted(settled, wait) for settled, wait in reviews):  # and without a drift, no new decision
        assert dp.auto_choice["decisions"] == decisions, (dp.auto_choice, reviews)
    assert_every_rank_agrees(dp, dp.auto_choice)


@case("auto_switch_pays_what_the_old_method_owed")
def _():
    torch.manual_seed(0)
    dp = gpurig.DataParallel(torch.nn.Linear(300, 200), compression="auto")
    dp.buckets[0].method = "int8"  # as if auto had chosen int8 earlier
    x = torch.randn(8, 300)
    dp(x).sum().backward()
    switch_method(dp.buckets[0].state, "int8", "none", R, P)  # and now back to none: the next average pays the debt
    dp.buckets[0].method = "none"
    owed = dp.buckets[0].state.sent.clone()
    assert owed.abs().max() > 0
    dp.zero_grad()
    dp(x).sum().backward()
    want = comm.allreduce(torch.autograd.grad(dp.module(x).sum(), dp.module.weight)[0].clone(), op="average")
    start = dp.buckets[0].offsets[[p is dp.module.weight for p in dp.buckets[0].params].index(True)]
    want += comm.allreduce(owed[start: start + want.numel()].view_as(want).clone(), op="average")
    assert torch.allclose(dp.module.weight.grad, want, atol=1e-5)
    assert dp.buckets[0].state.sent is None


write(R)
