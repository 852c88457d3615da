"""gpurig bench on 2 ranks over MPI and Gloo: nccl-tests' busbw, agreeing with the raw engine's call."""

import json
import time

import pytest
import torch

import gpurig.measure.bench
import gpurig.measure.profile
import gpurig.errors
import gpurig.measure.comm
import gpurig.measure.local
import gpurig.timing
from conftest import gpurig as gpurig_cli
from conftest import run_cli
from gpurig.measure import local
from gpurig.measure.comm import COMPRESSED_VALUES


def nccl_tests_busbw(collective, nbytes, seconds, n):
    """nccl-tests' definitions, written out here independently of gpurig.perf.busbw."""
    factor = {"allreduce": 2 * (n - 1) / n, "allgather": (n - 1) / n, "broadcast": 1.0, "sendrecv": 1.0}[collective]
    return nbytes / seconds * factor / 1e9


@pytest.mark.slow
def test_bench_comm_over_mpi_and_gloo(tmp_path):
    profile_path = tmp_path / "profile.json"
    done = gpurig_cli("bench", "--quick", "--engine", "mpi,torch", "--parts", "comm,p2p", "--min-kb", "16",
                      "--max-mb", "1", "--out", profile_path, "--plot", tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    profile = json.loads(profile_path.read_text())
    assert profile["schema"] == "gpurig-profile/1" and profile["comm"]["ranks"] == 2
    assert set(profile["comm"]["engines"]) == {"mpi", "torch/gloo"}
    for engine, collectives in profile["comm"]["engines"].items():
        chains = {f"compressed:{c}" for c in ("fp16", "bf16", "int8", "int8-dynamic", "powersgd")}
        assert set(collectives) == {"allreduce", "allgather", "broadcast", "sendrecv"} | chains
        for name in chains:  # each codec's whole compressed average, timed by gradient size
            assert [r["bytes"] for r in collectives[name]["rows"]] == [4 * v for v in COMPRESSED_VALUES[:2]]  # quick
            assert all(r["seconds"] > 0 for r in collectives[name]["rows"])
            # PowerSGD's chain is timed again over 8 matrices: what each matrix beyond the first adds
            assert all((r.get("per_matrix_s", -1) >= 0) == name.endswith("powersgd")
                       for r in collectives[name]["rows"])
            # what posting such a bucket under computation costs it (up to POSTED_VALUES_MAX), and its line
            assert all(r["posted_s"] >= 0 for r in collectives[name]["rows"])
            assert collectives[name]["posted_alpha_s"] >= 0 and collectives[name]["posted_beta_s_per_byte"] >= 0
        overlap = profile["comm"]["overlap"][engine]  # a product timed alone and under queued allreduces
        assert overlap["slowdown"] >= 1.0 and overlap["samples"] > 0 and overlap["product_s"] > 0
        assert overlap["chain_s"] > 0 and overlap["posted_s"] >= 0   # and a chain of them, with collectives begun
        for name, entry in collectives.items():
            if name in chains:
                continue
            assert [r["bytes"] for r in entry["rows"]] == [16384, 65536, 262144, 1048576]
            for row in entry["rows"]:
                assert row["busbw_gbs"] == pytest.approx(nccl_tests_busbw(name, row["bytes"], row["seconds"], 2))
            assert entry["alpha_s"] >= 0 and "beta_s_per_byte" in entry   # beta can be swamped by noise here
        # gpurig's calls and the raw engine calls are timed interleaved, and each row says how they compare
        # (each iteration's raw/gpurig ratio, median). How close they are is a speed, measured by
        # benchmarks/allreduce_busbw.py and recorded in docs/benchmarks.md, not asserted here: under a loaded
        # suite Gloo's 1 MB calls vary by 50-600 % and a 3x band still failed (allgather 0.18 at load 3.5).
        for name in ("allreduce", "allgather", "broadcast"):
            for row in collectives[name]["rows"]:
                assert row["raw_over_gpurig"] > 0 and row["raw_seconds"] > 0, (engine, name, row)
    assert (tmp_path / "busbw.png").stat().st_size > 1000


def test_bench_local_parts_and_table(tmp_path):
    done = gpurig_cli("bench", "--quick", "--parts", "gemm,copy,loading,disk", "--repeat", 2, "--dir", tmp_path,
                      "--out", tmp_path / "p.json", timeout=180, env={"COLUMNS": "160"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "GEMM" in done.stdout and "disk read" in done.stdout
    profile = json.loads((tmp_path / "p.json").read_text())
    assert [r["batch"] for r in profile["gemm"]["rows"]] == [31, 32, 33, 63, 64, 65, 128]
    assert profile["config"]["repeat"] == 2 and all(r["tflops"] > 0 for r in profile["gemm"]["rows"])
    assert profile["host_device"]["available"] == torch.cuda.is_available()
    assert profile["disk"]["mb_per_s"] > 0 and profile["loading"]["blocking_ms"] > 0


def test_prefetching_hides_the_smaller_of_loading_and_compute(tmp_path):
    # blocking pays both; prefetching at most both (it cannot be slower than doing them in turn, up to noise:
    # on this shared 2-core machine one 6-step measurement can land in a busy moment, so up to three tries)
    for _ in range(3):
        r = local.loading(2 << 20, steps=6, directory=str(tmp_path))
        if r["prefetch_ms"] <= 1.5 * r["blocking_ms"]:
            break
    assert r["blocking_ms"] >= 0.8 * max(r["load_ms"], r["compute_ms"])
    assert r["prefetch_ms"] <= 1.5 * r["blocking_ms"], r


def test_bad_bench_requests_are_one_line():
    for args, expected in ((["-n", "1", "--parts", "comm"], "at least 2"), (["--engine", "nccl2"], "unknown engine"),
                           (["--parts", "gpu"], "unknown part"), (["--repeat", "0"], "--repeat must be")):
        code, out, err = run_cli(["bench", *args])  # in this process: the console command runs in the tests above
        assert code == 2 and expected in err and len(err.strip().splitlines()) == 1, err


def test_a_bad_dir_is_refused_before_anything_is_measured(tmp_path):
    (tmp_path / "file").write_text("")
    for directory, expected in ((tmp_path / "none", "no such directory"), (tmp_path / "file", "not a directory"),
                                ("", "want a directory")):
        # comm first: it would measure for half a minute before the disk part found the directory missing
        code, out, err = run_cli(["bench", "--quick", "--parts", "comm,disk", "--dir", directory,
                                  "--out", tmp_path / "profile.json"])
        assert code == 2 and f"--dir {directory}" in err and expected in err, err
        assert len(err.strip().splitlines()) == 1 and not (tmp_path / "profile.json").exists()


def test_repeated_takes_keep_each_numbers_median():
    """bench --repeat: every measured float is the median of its takes; counts, shapes and names stay."""
    takes = [{"ranks": 2, "device": "cpu", "gemm": [{"m": 64, "n": 1024, "seconds": s, "flops": 1e9}
                                                    for s in (a, b)], "memory_bytes_per_s": mem}
             for a, b, mem in ((1.0, 5.0, 10e9), (3.0, 4.0, 30e9), (2.0, 6.0, 20e9))]
    merged = gpurig.measure.profile.median_profile(takes)
    assert merged == {"ranks": 2, "device": "cpu", "memory_bytes_per_s": 20e9,
                      "gemm": [{"m": 64, "n": 1024, "seconds": 2.0, "flops": 1e9},
                               {"m": 64, "n": 1024, "seconds": 5.0, "flops": 1e9}]}
    assert gpurig.measure.profile.median_profile(takes[:2])["gemm"][0]["seconds"] == 2.0  # an even count: the mean of the two


def test_turn_about_timing_drops_a_slow_spell():
    """A slow spell of the machine (here: three consecutive runs, whatever runs) makes one function look slow
    when its repeats run back to back, and none when the functions are timed turn about."""
    calls = []

    def spell_aware(name):
        def run():
            calls.append(name)
            time.sleep(0.02 if 6 <= len(calls) <= 8 else 0.002)  # runs 6-8 fall in the spell
        return run

    back_to_back = [gpurig.timing.timed(spell_aware(name), repeats=5, typical=True, warmup=0) for name in "abc"]
    assert back_to_back[0] < 0.01 < back_to_back[1] and back_to_back[2] < 0.01
    calls.clear()
    turns = gpurig.timing.timed_turns([spell_aware(name) for name in "abc"], rounds=5, warm=0)
    assert max(turns) < 0.01 and calls[5:8] == ["c", "a", "b"]


def test_a_gemm_timing_repeats_a_tiny_product_a_bounded_number_of_times():
    """A GPU's FLOP budget once made a tiny product's timed run 150,000 launches: `gpurig train`'s own
    calibration ran minutes on two ranks sharing a GPU. Each run now repeats at most MAX_CALLS_PER_RUN times
    (a timer that reports 1 s a run shows how many calls the run was)."""
    from gpurig.measure.compute import MAX_CALLS_PER_RUN, gemm_rows

    one_second_each = lambda runs: [1.0] * len(runs)  # noqa: E731
    tiny, large = gemm_rows([(16, 10, 1024), (512, 512, 512)], torch.device("cpu"), one_second_each, budget_flops=5e10)
    assert tiny["seconds"] == 1.0 / MAX_CALLS_PER_RUN
    assert large["seconds"] == 1.0 / (5e10 // (2 * 512 ** 3))   # under the bound: the FLOP budget decides


def test_profile_loader_refuses_other_files(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("{}")
    with pytest.raises(gpurig.errors.UsageError, match="not a gpurig profile"):
        gpurig.measure.profile.load_profile(path)


def test_profile_fits_the_isolated_timings_where_they_were_measured():
    """Back-to-back loops give ``seconds``; single calls after a barrier (``isolated``, what predict's
    calibration asks for) give ``isolated_seconds``, and the latency/bandwidth fit uses those when every row has
    them. Here the two differ by a fixed 1 ms, which must land in the fitted latency of one fit only."""
    rows = [{"collective": "allreduce", "bytes": b, "seconds": 1e-5 + b / 1e9, "busbw_gbs": 1.0} for b in (1e4, 1e6, 1e7)]
    plain = gpurig.measure.profile.summarize_engine(rows)["allreduce"]
    isolated = gpurig.measure.profile.summarize_engine(
        [{**r, "isolated_seconds": r["seconds"] + 1e-3} for r in rows])["allreduce"]
    assert plain["alpha_s"] == pytest.approx(1e-5, rel=1e-3)
    assert isolated["alpha_s"] == pytest.approx(1e-3 + 1e-5, rel=1e-3)
    assert isolated["beta_s_per_byte"] == pytest.approx(plain["beta_s_per_byte"], rel=1e-3)


def test_collectives_are_timed_in_loops_of_back_to_back_calls():
    """nccl-tests' way: each timed sample is a loop of calls, the two functions' loops taking turns."""
    calls = []
    ours, raw = gpurig.measure.comm.timed_loops(lambda: calls.append("a"), lambda: calls.append("b"), loops=4, per_loop=3)
    assert len(ours) == len(raw) == 4
    assert "".join(calls) == "aaabbb" "bbbaaa" "aaabbb" "bbbaaa"


@pytest.mark.parametrize("columns,shown", [(80, ["codec int8-dynamic", "123456.0", "13.456", "234567.8"]),
                                           (160, ["compressed:int8-dynamic", "12.345", "isolated time"])])
def test_the_bench_table_shows_its_numbers_whole(columns, shown, capsys, monkeypatch):
    """At 80 columns the collectives' table drops its lines and algbw and names a codec's chain by the codec; a
    wide terminal gets every column. The largest numbers a bench prints (256 MB, 0.1 s) stay whole."""
    from gpurig.cli.bench import show

    monkeypatch.setenv("COLUMNS", str(columns))
    row = {"bytes": 256 << 20, "seconds": 0.123456, "algbw_gbs": 12.345, "busbw_gbs": 12.345,
           "raw_busbw_gbs": 13.456, "raw_over_gpurig": 0.97, "isolated_seconds": 0.2345678}
    engines = {"torch/gloo": {name: {"rows": [row], "alpha_s": 1e-5, "fitted_gbs": 3.0}
                              for name in ("allreduce", "compressed:int8-dynamic")}}
    show({"comm": {"ranks": 2, "engines": engines}}, "profile.json", [])
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= columns and "…" not in out
    assert all(text in out for text in shown), out
