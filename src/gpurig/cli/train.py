"""``gpurig train`` on the command line: flags in, progress bar and tables out (no training logic here)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from gpurig.cli.common import HelpFormatter, WIDE_COLUMNS


EPILOG = """\
examples:
  gpurig train                              # the source's MNIST net, all local GPUs (else 2 CPU ranks), over MPI
  gpurig train -n 4 --model cnn --epochs 3  # 4 ranks, the small CNN
  gpurig train --engine torch               # torch.distributed (Gloo on CPU, NCCL on GPU) instead of MPI
  gpurig train --epochs 8 --resume          # continue from the last checkpoint to epoch 8
  gpurig train --compression int8           # 8-bit gradients with error feedback (slow networks)
  gpurig train --parallel model             # split the big layers over the ranks instead of the batch
  gpurig train --model wide-cnn --parallel hybrid   # Krizhevsky: convolutions data-, dense layers model-parallel
  gpurig train --json | jq .test_accuracy   # machine-readable summary
  gpurig train --on-nonfinite skip          # skip steps whose averaged gradients hold NaN or Inf
  gpurig train --precision bf16             # automatic mixed precision (fp16: with a loss scaler)
  gpurig train --global-batch 512 --accumulate 4   # 4 micro-batches of 128 per step, one allreduce
  gpurig train --shard optimizer            # ZeRO: each rank keeps 1/N of the optimizer state (gradients: also 1/N of those)
  gpurig train --model my_pkg.models:build --data my_pkg.data:load   # your own model and data
  gpurig train --logdir runs/tb             # metrics to TensorBoard too (always: runs/train/metrics.jsonl)
  gpurig train --timeline trace.json        # every rank's steps as a Chrome trace (ui.perfetto.dev)
  gpurig train --checkpoint-every 50 --max-restarts 3   # restart by itself, losing at most 50 steps

Each step is reported split into compute, communication not hidden under the
backward pass (comm), waiting for slower ranks (wait) and data loading (data),
and each epoch's achieved TFLOP/s (the model's forward and backward FLOPs per
second, all ranks; in --json: tflops, mfu, flops_per_step, peak_flops_per_s (one
rank's, null when unknown) and peak, where it comes from) and MFU, of the
peak: the catalog's on a GPU, on CPU ranks the GEMM rate this job's calibration
measured (else runs/bench/profile.json from gpurig bench; with neither, as with
--no-predict, MFU is not known). --timeline FILE draws every rank's steps.
With --parallel model or hybrid, comm is the activations exchanged by the split
layers (all of it waited for) plus, in hybrid, the averaged gradients.

Checkpoints: checkpoint-epochN.pt after every epoch (with a SHA-256 line that
loading checks), the last --keep-checkpoints kept, `latest` naming the newest.
--resume continues from the newest one that is intact, saying which damaged
ones it passed over. A rank that dies or stops is reported within
--failure-timeout seconds, naming it, its host and its collective; with
--max-restarts K the job then starts again by itself (up to K times) from the
newest checkpoint, saying what is lost: the steps since that checkpoint.
--checkpoint-every STEPS checkpoints between epochs too (checkpoint-epoch4-step5.pt),
so at most STEPS steps are lost; the resumed run ends with the same weights.
"""


def add_parser(subparsers) -> None:
    """Register ``gpurig train`` and its flags."""
    from gpurig.cli.common import add_reliability_flags, add_restart_flags

    p = subparsers.add_parser(
        "train", help="data-, model- or hybrid-parallel training of a reference model on this machine's devices "
                      "(the main job)",
        description="Train a reference model (the source's 784-1200-1200-10 MNIST net, or a small CNN) on 5,000 "
                    "real MNIST digits, or your own model and data, across N ranks: with data parallelism (each rank computes on its part of "
                    "the global batch and gradients are averaged during the backward pass), model parallelism "
                    "(the fully connected layers' weights split over the ranks, all on the same batch) or both "
                    "(Krizhevsky's scheme).",
        epilog=EPILOG, formatter_class=HelpFormatter)
    p.add_argument("-n", "--nprocs", type=int, default=None,
                   help="number of ranks (default: one per GPU, else 2 CPU ranks)")
    p.add_argument("--engine", default="mpi", help="mpi (default, via mpi4py) or torch (torch.distributed)")
    p.add_argument("--hosts", default=None, help="hosts and slots, e.g. a:4,b:4 (MPI engine)")
    p.add_argument("--mpi-args", default="", help="extra arguments passed to mpirun")
    p.add_argument("--model", default="mlp", help="mlp (784-1200-1200-10, default), cnn (two convolutions, a 256-unit dense layer) or wide-cnn "
                        "(the same with 4096 units: 98 %% of its weights in the dense head, for --parallel hybrid), "
                        "or your own: module:factory or file.py:factory, a function returning a torch.nn.Module")
    p.add_argument("--data", default="mnist", help="mnist (default: 4,000 train / 1,000 test), or your own: "
                        "module:loader or file.py:loader, a function returning (train, test), each (inputs, labels) "
                        "or a torch Dataset")
    p.add_argument("--epochs", type=int, default=5, help="train until this epoch (default 5)")
    p.add_argument("--global-batch", type=int, default=128,
                   help="samples per step over all ranks (default 128, the source's: 64 per rank on 2)")
    p.add_argument("--optimizer", default="momentum",
                   help="torch.optim's update: momentum (default: SGD with momentum, the source's), sgd, adam or "
                        "adamw (the names gpurig predict prices)")
    p.add_argument("--lr", type=float, default=None,
                   help="learning rate (default 0.05 for sgd and momentum, torch's 0.001 for adam and adamw)")
    p.add_argument("--momentum", type=float, default=None, help="SGD's momentum, with --optimizer momentum (default 0.9)")
    p.add_argument("--weight-decay", type=float, default=None,
                   help="weight decay (default torch's: 0, and 0.01 for adamw)")
    p.add_argument("--seed", type=int, default=0, help="seed for initial weights and data order")
    p.add_argument("--bucket-mb", type=float, default=None,
                   help="gradient bucket size in MB (default 25; 4 when gradients are compressed)")
    p.add_argument("--compression", default=None,
                   help="gradient compression: auto (default without --shard: measure the first steps, then per bucket compress "
                        "only where the network is the bottleneck, with fp16, int8 or powersgd; auto:fp16,int8 to "
                        "choose among those only), none, fp16, bf16, int8, int8-dynamic (8 bits: 4x fewer bytes), "
                        "powersgd or powersgd:R (rank-R factors, default 4); all with error feedback; "
                        "with --shard: none (its default), fp16, bf16, int8 or int8-dynamic")
    p.add_argument("--shard", default="none",
                   help="ZeRO: none (default), optimizer (stage 1: gradients reduce-scattered, each rank updates "
                        "its 1/N of the parameters with its 1/N of the optimizer state, parameters allgathered) or "
                        "gradients (stage 2: each rank also keeps only its 1/N of the averaged gradients); "
                        "the same updates and bytes on the wire as unsharded; checkpoints hold the whole state")
    p.add_argument("--parallel", default="data",
                   help="data (default: each rank its part of the batch, gradients averaged), model (the fully "
                        "connected layers split over the ranks, column then row, every rank the whole batch) or "
                        "hybrid (what comes before the split layers data-parallel, the split layers on the whole "
                        "batch gathered from all ranks)")
    p.add_argument("--checkpoint-dir", default="runs/train",
                   help="where checkpoint-epochN.pt is written after each epoch (a fresh run clears it)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest intact checkpoint in --checkpoint-dir (any rank count)")
    p.add_argument("--keep-checkpoints", type=int, default=3, metavar="K", help="checkpoints kept (default 3)")
    p.add_argument("--checkpoint-every", type=int, default=None, metavar="STEPS",
                   help="also checkpoint every STEPS steps (counted over the run), mid-epoch: a restart or --resume "
                        "then loses at most STEPS steps, and resumes at that step exactly")
    p.add_argument("--on-nonfinite", default="stop",
                   help="when gradients hold NaN or Inf (averaged ones, or split layers' on any rank; with fp16 "
                        "even at a loss scale below 1): stop (default: one line naming the step and the parameter, "
                        "exit 1, the last checkpoint intact), skip (every rank leaves the weights alone for that "
                        "step) or ignore (not with fp16)")
    p.add_argument("--find-unused-parameters", action="store_true",
                   help="as DDP's: a parameter no rank's forward used keeps no gradient, so the optimizer leaves it "
                        "alone, as in one process (one small allreduce a step; your own model with branches or "
                        "heads a batch may skip)")
    p.add_argument("--precision", default="fp32", type=str.lower,
                   help="fp32 (default), tf32 (NVIDIA GPUs), bf16 or fp16: automatic mixed precision (torch.autocast; "
                        "FP32 master weights; fp16 with a loss scaler whose skipped steps every rank agrees on); "
                        "the words gpurig predict takes")
    p.add_argument("--accumulate", type=int, default=1, metavar="K",
                   help="gradient accumulation: each step's global batch in K micro-batches, gradients averaged "
                        "once per step (the same update as K=1, a K-th of the activation memory)")
    p.add_argument("--logdir", default=None, metavar="DIR",
                   help="also write the per-step and per-epoch metrics as TensorBoard event files here "
                        "(tensorboard --logdir DIR); they are always in metrics.jsonl beside the checkpoints")
    p.add_argument("--timeline", "--timeline-filename", dest="timeline", default=None, metavar="FILE",
                   help="write every rank's steps as a Chrome trace (open it in https://ui.perfetto.dev): data "
                        "loading, forward, backward, each bucket's copy and allreduce (or encode, send, decode), "
                        "the communication backward did not hide, the wait for the slowest rank, the optimizer")
    p.add_argument("--no-predict", dest="predict", action="store_false",
                   help="skip the measurements behind the predicted step split (about 10 s on 2 CPU ranks)")
    add_reliability_flags(p)
    add_restart_flags(p)
    p.add_argument("--json", action="store_true", help="print only the run's summary as JSON")
    p.set_defaults(handler=run)


def _config(args):
    from gpurig.train import TrainConfig

    return TrainConfig(model=args.model, data=args.data, epochs=args.epochs, global_batch=args.global_batch,
                       optimizer=args.optimizer, lr=args.lr, momentum=args.momentum,
                       weight_decay=args.weight_decay, seed=args.seed, nprocs=args.nprocs,
                       engine=args.engine, hosts=args.hosts, mpi_args=args.mpi_args, bucket_mb=args.bucket_mb,
                       compression=(args.compression if args.compression is not None  # '' is refused, not the default
                                    else "auto" if args.shard == "none" else "none"),
                       shard=args.shard, parallel=args.parallel, predict=args.predict,
                       checkpoint_dir=args.checkpoint_dir, resume=args.resume,
                       keep_checkpoints=args.keep_checkpoints, checkpoint_every=args.checkpoint_every,
                       on_nonfinite=args.on_nonfinite, find_unused_parameters=args.find_unused_parameters,
                       iface=args.iface,
                       precision=args.precision, accumulate=args.accumulate, logdir=args.logdir, timeline=args.timeline,
                       max_restarts=args.max_restarts,
                       failure_timeout=_seconds(args.failure_timeout, "--failure-timeout"),
                       stall_timeout=_seconds(args.stall_timeout, "--stall-timeout"),
                       stall_shutdown=_seconds(args.stall_shutdown, "--stall-shutdown"))


def _seconds(text, flag):
    from gpurig.launch.settings import seconds

    return None if text is None else seconds(text, flag)


def run(args) -> int:
    """Run ``gpurig train`` with parsed ``args``; return the exit code."""
    from gpurig.train import launch_training

    config = _config(args)
    if args.json:  # stdout holds the summary only; a restart and the calibration are still said, on stderr
        def on_event(event):
            if event["event"] in ("restart", "calibrating"):
                print(_said(event), file=sys.stderr, flush=True)

        code, events = launch_training(config, on_event=on_event)
        done = [e for e in events if e["event"] == "done"]
        if code == 0 and done:
            print(json.dumps({k: v for k, v in done[-1].items() if k != "event"}, indent=2))
    else:
        view = _TrainView()
        try:
            code, events = launch_training(config, on_event=view.update)
        finally:
            view.close()
        if code == 0 and events and events[-1]["event"] == "done":
            view.summary(events[-1])
    stopped = [e for e in events if e["event"] == "error"]
    if stopped:  # the ranks stopped together (a diverging run): rank 0's one line
        print(f"gpurig train: {stopped[-1]['message']}", file=sys.stderr)
    finished = [e for e in events if e["event"] == "done"]
    if code == 0 and finished and _diverged(finished[-1]):
        print(f"gpurig train: warning: {_diverged(finished[-1])}", file=sys.stderr)
    return code


def _diverged(done: dict) -> str | None:
    """What to say when a run that skipped its bad steps (``--on-nonfinite skip``) ended with a loss that is not a
    number: it diverged, whatever its exit code.

    >>> _diverged({"epochs": [{"loss": float("nan")}], "skipped_steps": 29})
    "the last epoch's loss is nan, and 29 steps were skipped for NaN or Inf gradients: the run diverged, and its weights are no trained model (lower --lr; --on-nonfinite stop ends a run at its first such step)"
    >>> _diverged({"epochs": [{"loss": 0.3}], "skipped_steps": 1}) is None
    True
    """
    import math

    loss = done["epochs"][-1]["loss"] if done.get("epochs") else 0.0
    if math.isfinite(loss):
        return None
    return (f"the last epoch's loss is {loss}, and {done.get('skipped_steps', 0)} steps were skipped for NaN or Inf "
            f"gradients: the run diverged, and its weights are no trained model (lower --lr; --on-nonfinite stop "
            f"ends a run at its first such step)")


def _said(event: dict) -> str:
    """The line a ``restart`` or ``calibrating`` event prints.

    >>> _said({"event": "calibrating", "ranks": 2, "device": "cpu"})
    "gpurig train: measuring this job's 2 ranks and their links for the prediction (seconds; --no-predict skips it)"
    """
    from gpurig.train.job import restart_line

    if event["event"] == "calibrating":
        return (f"gpurig train: measuring this job's {_ranks(event['ranks'])} and their links for the prediction "
                "(seconds; --no-predict skips it)")
    return f"gpurig train: {restart_line(event)}"


class _TrainView:
    """Rich progress bar and epoch table fed by rank 0's events."""

    COLUMNS = [("epoch", "epoch"), ("loss", "loss"), ("test_accuracy", "test acc"),
               ("samples_per_s", "samples/s"), ("step_ms", "step"), ("compute_ms", "compute"),
               ("comm_ms", "comm"), ("wait_ms", "wait"), ("data_ms", "data"), ("tflops", "TFLOP/s"), ("mfu", "MFU")]

    FORMATS = {"epoch": "{}", "loss": "{:.4f}", "test_accuracy": "{:.1%}", "samples_per_s": "{:.0f}",
               "step_ms": "{:.1f}", "compute_ms": "{:.1f}", "comm_ms": "{:.1f}", "wait_ms": "{:.1f}",
               "data_ms": "{:.1f}", "tflops": "{:.3g}", "mfu": "{:.1%}"}
    NARROW_DROPS = ("data_ms", "tflops")

    def __init__(self):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        from gpurig.launch.env import in_launched_job
        from gpurig.launch.output import COLUMNS_VARIABLE

        # Started as a rank (gpurig run / emulate, mpirun): lines only, as wide as the terminal the launcher's
        # output reaches (a spinner or a bar would be redrawn through the launcher's pipes into the user's log).
        as_rank = in_launched_job()
        if as_rank:
            columns = int(os.environ.get(COLUMNS_VARIABLE) or 0)
            self.console = Console(width=columns or WIDE_COLUMNS, force_terminal=False, soft_wrap=True)
        else:
            self.console = Console()
            if not self.console.is_terminal:
                # a log or a pipe: 80 columns would cut the table's numbers; a line is one line (grep finds it)
                self.console = Console(width=None if "COLUMNS" in os.environ else WIDE_COLUMNS, soft_wrap=True)
        # the bar is the run's (resumed: what is left of it); the epoch is said beside it
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("steps of the run"),
                                 TextColumn("loss {task.fields[loss]}"), TimeRemainingColumn(),
                                 console=self.console, transient=True, disable=as_rank)
        self.task = None
        self.start: dict = {}
        # Until rank 0 says it has started (seconds: the configuration checked, PyTorch loaded in every rank, the
        # data read), a spinner says what is happening; a log or a pipe gets nothing from it.
        self.waiting = None
        if not as_rank:
            self.waiting = self.console.status("gpurig train: checking the configuration, starting the ranks")
            self.waiting.start()
        self.started = False

    def _stop_waiting(self) -> None:
        if self.waiting is not None:
            self.waiting.stop()
            self.waiting = None

    def update(self, event: dict) -> None:
        kind = event["event"]
        self._stop_waiting()
        if kind == "calibrating":
            self.console.print(_said(event), markup=False, highlight=False)
        elif kind == "start" and event["first_epoch"] >= event["epochs"]:
            self.start = event
            self.console.print(f"[bold]gpurig train[/]: {_nothing_to_train(event)}", highlight=False)
        elif kind == "start":
            self.start = event
            per_rank = event["global_batch"] // (1 if event["parallel"] == "model" else event["ranks"])
            held = ", ".join(f"{b / 2**20:.1f}" for b in event["parameter_bytes_per_rank"])
            self.console.print(
                f"[bold]gpurig train[/]: {event['model']} ({_count(event['parameters'])} parameters), "
                f"{_ranks(event['ranks'])} over {event['engine']}, {event['parallel']} parallel"
                f"{_shard_words(event.get('shard', 'none'))}, global batch "
                f"{event['global_batch']} ({per_rank} per rank), epochs {event['first_epoch'] + 1}..{event['epochs']}\n"
                f"parameters held per rank: {held} MB (whole model {event['parameter_bytes_whole'] / 2**20:.1f} MB)")
            self.progress.start()
            self.started = True
            total = event["steps_per_epoch"] * (event["epochs"] - event["first_epoch"])
            self.task = self.progress.add_task("training", total=total, loss="-")
        elif kind == "step" and self.task is not None:
            done = (event["epoch"] - self.start["first_epoch"]) * self.start["steps_per_epoch"] + event["step"]
            self.progress.update(self.task, completed=done, loss=f"{event['loss']:.3f}",
                                 description=f"epoch {event['epoch'] + 1}/{self.start['epochs']}")
        elif kind == "restart":
            if self.task is not None:
                self.progress.remove_task(self.task)
                self.task = None
            self.progress.stop()
            from gpurig.train.job import restart_line

            self.console.print(restart_line(event), markup=False, highlight=False)
        elif kind == "epoch":
            self.progress.console.print(
                f"epoch {event['epoch']}/{self.start['epochs']}  loss {event['loss']:.4f}  "
                f"test {100 * event['test_accuracy']:.1f} %  {event['samples_per_s']:.0f} samples/s  "
                f"step {event['step_ms']:.1f} ms = compute {event['compute_ms']:.1f} + comm {event['comm_ms']:.1f}"
                f" + wait {event['wait_ms']:.1f} + data {event['data_ms']:.1f}"
                + (f"  {event['tflops']:.3g} TFLOP/s" if event.get("tflops") is not None else "")
                + (f"  MFU {event['mfu']:.1%}" if event.get("mfu") is not None else ""))

    def close(self) -> None:
        self._stop_waiting()
        if self.started:   # a bar never started would still print its empty line
            self.progress.stop()

    def summary(self, done: dict) -> None:
        from rich.table import Table

        from rich import box

        # below 120 columns the table drops its lines and the columns the epoch lines above already show
        # (data, TFLOP/s), so that every number stays whole in an 80-column terminal
        wide = self.console.width >= WIDE_COLUMNS
        columns = [(k, h) for k, h in self.COLUMNS if wide or k not in self.NARROW_DROPS]
        table = Table(title=f"{done['model']} on {done['data']}: {_ranks(done['ranks'])}, {done['engine']}, "
                            f"ms per step", box=box.HEAVY_HEAD if wide else box.SIMPLE_HEAD,
                      pad_edge=wide, collapse_padding=not wide)
        for _, header in columns:
            table.add_column(header, justify="right", no_wrap=True)
        for row in done["epochs"]:
            table.add_row(*("—" if row.get(k) is None else self.FORMATS[k].format(row[k]) for k, _ in columns))
        predicted = done.get("predicted") or {}
        if "step_ms" in predicted:
            table.add_section()
            values = {"epoch": "pred.", "samples_per_s": f"{done['global_batch'] / predicted['step_ms'] * 1000:.0f}",
                      "step_ms": f"{predicted['step_ms']:.1f}", "compute_ms": f"{predicted['compute_ms']:.1f}",
                      "comm_ms": f"{predicted['comm_ms']:.1f}", "wait_ms": f"{predicted['wait_ms']:.1f}",
                      "data_ms": f"{predicted['data_ms']:.1f}"}
            table.add_row(*(values.get(k, "") for k, _ in columns))
        self.console.print(table)
        self.console.print(f"test accuracy {100 * done['test_accuracy']:.1f} %; checkpoint {done['checkpoint']}")
        if done.get("shard", "none") != "none":
            held = ", ".join(f"{b / 2**20:.2f}" for b in done["optimizer_state_bytes_per_rank"])
            self.console.print(f"optimizer state held per rank (--shard {done['shard']}): {held} MB")
        if done.get("peak"):
            known = any(row.get("mfu") is not None for row in done["epochs"])
            hint = "" if predicted else ", or train without --no-predict"  # its calibration measures the peak
            of = f"of {done['ranks']} x {done['peak']}" if known else f"— ({done['peak']}{hint})"
            self.console.print(f"TFLOP/s: the model's forward and backward FLOPs per second, all ranks; MFU: {of}",
                               markup=False, highlight=False)
        chose = choice_line(done)
        if chose:
            self.console.print(chose)
        if "step_ms" in predicted:
            self.console.print(f"pred.: predicted by gpurig predict from this job's own micro-benchmarks "
                               f"({predicted['profile']}), compression {predicted['compression']}")
        elif predicted:
            self.console.print(f"no prediction: {predicted['error']}")


def _ranks(n: int) -> str:
    """A rank count in words.

    >>> _ranks(1), _ranks(4)
    ('1 rank', '4 ranks')
    """
    return f"{n} rank{'s' * (n != 1)}"


def _nothing_to_train(start: dict) -> str:
    """What the start line says when a resumed run is already at or past ``--epochs``.

    >>> print(_nothing_to_train({"model": "mlp", "epochs": 1, "first_epoch": 2, "first_step": 0}))
    mlp: the checkpoint is at the end of epoch 2 and --epochs 1 asks for no more: nothing to train (--epochs 3 or more trains on)
    """
    from gpurig.train.checkpoints import Position

    at = Position(start["first_epoch"], start.get("first_step", 0))
    return (f"{start['model']}: the checkpoint is at {at} and --epochs {start['epochs']} asks for no more: "
            f"nothing to train (--epochs {at.epochs + 1} or more trains on)")


def _shard_words(shard: str) -> str:
    """How the start line says ``--shard``.

    >>> _shard_words("gradients"), _shard_words("none")
    (' (ZeRO: optimizer state and gradients sharded)', '')
    """
    return {"optimizer": " (ZeRO: optimizer state sharded)",
            "gradients": " (ZeRO: optimizer state and gradients sharded)"}.get(shard, "")


def _count(n: int) -> str:
    """A parameter count as people write it.

    >>> _count(2395210), _count(8970)
    ('2.4 M', '8,970')
    """
    return f"{n / 1e6:.1f} M" if n >= 100_000 else f"{n:,}"


def choice_line(done: dict) -> str | None:
    """What ``--compression auto`` chose, and from what, in one line (None when it did not choose).

    >>> print(choice_line({"compression": "auto", "compression_choice": {
    ...     "methods": ["powersgd", "powersgd"], "bandwidth_gbit_s": 0.96, "none_ms": 70.9, "chosen_ms": 9.6,
    ...     "trials": [{"methods": ["int8", "powersgd"], "ms": 52.0}, {"methods": ["powersgd", "powersgd"], "ms": 49.6}]}}))
    compression auto chose powersgd, powersgd (one per bucket): link 0.96 Gbit/s, predicted wait 9.6 ms (70.9 uncompressed); steps timed: int8+powersgd 52.0 ms, powersgd+powersgd 49.6 ms
    """
    choice = done.get("compression_choice")
    if not choice or "methods" not in choice:
        return None
    line = (f"compression {done['compression']} chose {', '.join(choice['methods'])} (one per bucket): link "
            f"{choice['bandwidth_gbit_s']:.2f} Gbit/s, predicted wait {choice['chosen_ms']:.1f} ms "
            f"({choice['none_ms']:.1f} uncompressed)")
    if choice.get("trials"):
        line += "; steps timed: " + ", ".join(f"{'+'.join(t['methods'])} {t['ms']:.1f} ms" for t in choice["trials"])
    return line
