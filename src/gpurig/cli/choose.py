"""``gpurig choose`` on the command line: flags in, a ranked table (or JSON) and a cost-against-time plot out."""

from __future__ import annotations

import argparse
import json

from gpurig.cli.common import HelpFormatter, WIDE_COLUMNS, check_plot_path, figures, users_prints_aside

EPILOG = """\
examples:
  gpurig choose --model bert-base --batch 32 --tokens 128           # the recent GPUs at 1, 2 and 4
  gpurig choose --model resnet50 --budget 5000 --objective time      # the fastest build for $5,000
  gpurig choose --model resnet50 --candidates "RTX 4090, RTX 5090, RTX 6000 Ada" --epochs 90 --dataset-size 1281167
  gpurig choose --model bert-large --precision bf16 --cloud --price "RTX 4090=1800" --price "H100 SXM=2.5/h"
  gpurig choose --model alexnet --candidates "GTX Titan X, GTX 980" --gpus 1 --cluster "2 x GTX 980"
  gpurig choose --model alexnet --cluster "4 GTX Titan" --cluster examples/cluster-3+1-titan.toml
  gpurig choose --model resnet50 --plot choose.png --json > choose.json

Each option is `gpurig predict --cluster "N x GPU"` (samples/s, memory per GPU,
scaling) and `gpurig plan` on the build around it (the cheapest CPU, board, PSU
and RAM of spec/data/parts.csv that pass the guide's rules; energy at the GPUs'
and CPU's TDP). Cost = the build + its energy over the work (with --cloud, the
cheaper of that and renting the GPUs), per million samples. Prices: the
catalog's (spec/data/prices.csv: launch, street, cloud per GPU-hour, each dated
and sourced), --prices FILE (CSV or TOML) over them, --price over both; a price
older than a year is marked !. Exit code 2 for an unknown GPU, a budget that
buys nothing, or a model that fits no option (with what would make it fit).
"""


def add_parser(subparsers) -> None:
    """Register ``gpurig choose``."""
    p = subparsers.add_parser(
        "choose", help="what to buy (or rent): GPUs and builds ranked by cost, time or energy for a model",
        description="Rank GPUs and whole builds for a model, a budget and a deadline: each option predicted "
                    "(gpurig predict), built by the hardware guide's rules (gpurig plan), priced, with the reasons.",
        epilog=EPILOG, formatter_class=HelpFormatter)
    p.add_argument("--model", required=True, help="a built-in model (as gpurig predict takes it) or module:factory")
    p.add_argument("--batch", type=int, default=None, help="samples per GPU per step (predict's default: 64)")
    p.add_argument("--tokens", type=int, default=None, help="sequence length for token models")
    p.add_argument("--sample", default=None,
                   help="one sample's input for a module:factory model, as predict takes it: 3x224x224, 128:int64")
    p.add_argument("--precision", default="fp32", type=str.lower, help="fp32 (default), tf32, fp16, bf16 or fp8, as predict takes it")
    p.add_argument("--optimizer", default=None,
                   help="sgd, momentum, adam, adamw or lamb (default: the model's usual one, as in gpurig predict)")
    p.add_argument("--optimizer-impl", default=None,
                   help="how it runs, as in gpurig predict: foreach (default), fused or for-loop")
    what = p.add_argument_group("what to compare")
    what.add_argument("--candidates", default=None, metavar="GPUS",
                      help='catalog GPUs, comma-separated: "RTX 4090, A100 PCIe 80 GB" (default: the newest '
                           "architectures with a price)")
    count = what.add_mutually_exclusive_group()
    count.add_argument("--gpus", type=int, default=None, metavar="N", help="exactly N of each candidate")
    count.add_argument("--max-gpus", type=int, default=None, metavar="N", help="1, 2, 4, … N of each (default 4)")
    what.add_argument("--cluster", action="append", default=[], metavar="CLUSTER",
                      help="a whole cluster as predict takes it (a description or a spec file); repeat to compare")
    what.add_argument("--cloud", action="store_true", help="also rent: cloud GPU-hours beside buying, break-even")
    work = p.add_argument_group("the work and the money")
    work.add_argument("--hours", type=float, default=None, metavar="H",
                      help="each option trains H hours (default 336, the guide's two weeks)")
    work.add_argument("--epochs", type=float, default=None, metavar="E", help="or: E epochs of --dataset-size")
    work.add_argument("--dataset-size", type=int, default=None, metavar="S", help="samples per epoch")
    work.add_argument("--budget", type=float, default=None, metavar="USD", help="the most the build may cost")
    work.add_argument("--objective", default="cost", choices=["cost", "time", "energy"],
                      help="rank by cost (default), time or energy per million samples")
    work.add_argument("--price-per-kwh", type=float, default=0.20, metavar="USD", help="electricity (default 0.20)")
    work.add_argument("--price", action="append", default=[], metavar="NAME=USD",
                      help='a GPU\'s or part\'s price: "RTX 4090=1800"; a cloud GPU-hour: "H100 SXM=2.5/h"')
    work.add_argument("--prices", default=None, metavar="FILE",
                      help="prices as CSV (name,usd,date,source[,cloud_usd_per_gpu_hour,…]) or TOML")
    p.add_argument("--plot", default=None, metavar="PNG", help="cost per unit of work against time, Pareto front")
    p.add_argument("--json", action="store_true", help="print every row as JSON")
    p.set_defaults(handler=run)


def request_from(args):
    """The :class:`~gpurig.choose.ChooseRequest` of parsed flags.

    >>> from gpurig.cli.parser import build_parser
    >>> request_from(build_parser().parse_args(["choose", "--model", "resnet50", "--candidates", "RTX 4090, 5090"])).candidates
    ('RTX 4090', '5090')
    """
    from gpurig.choose import ChooseRequest
    from gpurig.choose.options import parse_candidates
    from gpurig.errors import UsageError

    if args.candidates is not None and not parse_candidates(args.candidates):
        raise UsageError(f"--candidates {args.candidates!r} names no GPU: e.g. --candidates \"RTX 4090, RTX 5090\"")
    return ChooseRequest(model=args.model, batch=args.batch, tokens=args.tokens, sample=args.sample, precision=args.precision,
                         optimizer=args.optimizer, optimizer_impl=args.optimizer_impl, budget=args.budget, gpus=args.gpus, max_gpus=args.max_gpus,
                         hours=args.hours, epochs=args.epochs, dataset_size=args.dataset_size,
                         candidates=parse_candidates(args.candidates or ""), clusters=tuple(args.cluster),
                         cloud=args.cloud, objective=args.objective, price_per_kwh=args.price_per_kwh,
                         prices=tuple(args.price), prices_file=args.prices)


def run(args) -> int:
    """Run ``gpurig choose`` with parsed ``args``; return the exit code."""
    from gpurig.choose import choose

    if args.plot is not None:
        check_plot_path(args.plot)
    with users_prints_aside(args.json):
        result = choose(request_from(args))
    if args.plot:
        plot(result, args.plot)
    if args.json:
        print(json.dumps(result, indent=2, allow_nan=False))
        return 0
    show(result)
    if args.plot:
        print(f"plot: {args.plot}")
    return 0


def short(name: str) -> str:
    """A GPU name without the brand words, for narrow tables.

    >>> short("2 × GeForce RTX 4090"), short("1 × NVIDIA GeForce GTX Titan X")
    ('2 × RTX 4090', '1 × GTX Titan X')
    """
    for word in ("NVIDIA ", "GeForce ", "Radeon "):
        name = name.replace(word, "")
    return name


def _usd(value, stale: bool = False) -> str:
    return "—" if value is None else f"{value:,.0f}" + ("!" if stale else "")


def _money(value) -> str:
    """Cost per million samples: whole dollars from 100, cents from 1, three digits below.

    >>> _money(1234.5), _money(4.256), _money(0.01342), _money(None)
    ('1,234', '4.26', '0.0134', '—')
    """
    if value is None:
        return "—"
    return figures(value)


def show(result: dict) -> None:
    """The ranking as a rich table (key numbers whole at 80 columns; more columns when wider), each row's
    reasons, the cloud comparison and the notes."""
    from rich.console import Console

    from gpurig.choose.ranking import unbuildable

    console = Console()
    work = result["work"]
    by_epochs = work["mode"] == "epochs"
    doing = (f"{work['epochs']:g} epochs of {work['dataset_size']:,} samples" if by_epochs else
             f"{work['hours']:g} h of training each")
    console.print(f"[bold]gpurig choose[/]: {result['model']}, {result['batch_per_gpu']} per GPU, "
                  f"{result['precision']}, {result['optimizer']}; {doing}; electricity ${result['price_per_kwh']:.2f}/kWh"
                  + (f"; budget ${result['budget_usd']:,.0f}" if result["budget_usd"] else "")
                  + f"; ranked by {result['objective']} per million samples")
    columns = [("#", lambda r: f"{r['rank']}{'*' if r['pareto'] else ''}"),
               ("option", lambda r: short(r["option"])),
               ("samples/s", lambda r: figures(r['samples_per_s'])),
               ("hours" if by_epochs else "M samples",
                lambda r: f"{r['hours']:,.1f}" if by_epochs else f"{r['samples'] / 1e6:,.0f}"),
               ("GB/GPU", lambda r: f"{r['memory']['total_gb']:.2g}" + (" ok" if r["memory"]["fits"] else " [bold red]✗[/]")),
               ("build $", lambda r: _usd(r["build_usd"], any(p.get("stale") for p in r["gpu_prices"]))
                + (" ✗" if unbuildable(r) else "")),
               ("$/M", lambda r: _money(r["usd_per_m_samples"]) + (" rent" if r["cost_how"] == "rent" else ""))]
    wide_columns = columns[:6] + [("GPUs $", lambda r: _usd(r["gpu_usd"])), ("energy $", lambda r: _usd(r["energy_usd"])),
                                  ("kWh/M", lambda r: f"{r['kwh_per_m_samples']:.3g}"),
                                  ("speed-up", lambda r: f"{r['speedup']:.2f}x"),
                                  ("plan", lambda r: r["plan_overall"])] + columns[6:]
    # the wide table where the terminal holds it whole, numbers and all (from WIDE_COLUMNS on, it did not always)
    if console.width >= WIDE_COLUMNS and _table_width(wide_columns, result["rows"]) <= console.width:
        columns = wide_columns
    # where even the narrow one does not fit (a million hours' sample counts at 80 columns), the least needed
    # columns go, and the legend says so: a number is never cut
    left_out = []
    for header in ("hours" if by_epochs else "M samples", "GB/GPU", "build $"):
        if _table_width(columns, result["rows"]) <= console.width:
            break
        columns = [column for column in columns if column[0] != header]
        left_out.append(header)
    legend = "* Pareto front; ! price > 1 year old" + (
        "; ✗ no machine holds it (why)" if any(unbuildable(r) for r in result["rows"]) else "") + (
        f"; not shown at this width: {', '.join(left_out)} (--json has them)" if left_out else "")
    console.print(_whole_numbers_table(legend, columns, result["rows"]))
    console.print("why (the guide's reasons, predict's and plan's numbers):")
    for row in result["rows"]:
        console.print(f"  {row['rank']}. {short(row['option'])}: " + "; ".join(row["reasons"]), highlight=False)
    if result["cloud"]:
        _show_cloud(console, result["rows"])
    if result["over_budget"]:
        console.print(f"over the budget: {', '.join(short(o) for o in result['over_budget'])}")
    for note in result["notes"]:
        console.print(f"note: {note}", highlight=False)


def _cells(columns, rows: list[dict]) -> list[list[str]]:
    return [[value(row) for _, value in columns] for row in rows]


OPTION_WIDTH = 12   # the option's name wraps at this width; the numbers never do


def _widths(columns, cells: list[list[str]]) -> list[int]:
    """Each column's width with its numbers whole (the option's: :data:`OPTION_WIDTH`)."""
    from rich.text import Text

    return [OPTION_WIDTH if header == "option" else
            max([len(header)] + [len(Text.from_markup(line[i]).plain) for line in cells])
            for i, (header, _) in enumerate(columns)]


def _table_width(columns, rows: list[dict]) -> int:
    """Columns the table of ``columns`` needs with every number whole."""
    widths = _widths(columns, _cells(columns, rows))
    return sum(widths) + 3 * len(widths) + 1   # a space either side of each cell, a rule between and around


def _whole_numbers_table(title: str, columns, rows: list[dict]):
    """A rich table of ``columns`` (header, cell of a row) over ``rows``: the option's name wraps, numbers stay whole."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    cells = _cells(columns, rows)
    for (header, _), width in zip(columns, _widths(columns, cells)):
        if header == "option":
            table.add_column(header, overflow="fold", min_width=width)
        else:
            table.add_column(header, justify="right", no_wrap=True, min_width=width)
    for line in cells:
        table.add_row(*line)
    return table


def _show_cloud(console, rows: list[dict]) -> None:
    def break_even(row):
        even = row["break_even_hours"]
        return "never" if row["break_even_never"] else "—" if even is None else f"{even:,.0f}"

    columns = [("option", lambda r: short(r["option"])),
               ("$/h", lambda r: f"{r['cloud_usd_per_hour']:.2f}" + ("!" if any(p["stale"] for p in r["cloud_prices"])
                                                                    else "")),
               ("rent $", lambda r: _money(r["rent_usd"])), ("buy+energy $", lambda r: _usd(r["own_usd"])),
               ("break-even h", break_even)]
    table = _whole_numbers_table("buy or rent (the same work)", columns,
                                 [row for row in rows if row["cloud_usd_per_hour"] is not None])
    if table.row_count:
        console.print(table)
        console.print("break-even: the hours of use after which buying (and paying its electricity) costs less "
                      "than renting")
    else:
        console.print("no option has a cloud price: give --price 'NAME=USD/h'")


def plot(result: dict, path: str) -> None:
    """Cost per million samples against time to finish (hours per million samples when the work is a number of
    hours), the Pareto front drawn and labelled, the dominated options grey."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_epochs = result["work"]["mode"] == "epochs"
    rows = [r for r in result["rows"] if r["usd_per_m_samples"] is not None and r["memory"]["fits"]]

    def x_of(row):
        return row["hours"] if by_epochs else row["hours_per_m_samples"]

    figure, axes = plt.subplots(figsize=(7, 4.5))
    dominated = [r for r in rows if not r["pareto"]]
    front = sorted((r for r in rows if r["pareto"]), key=x_of)
    axes.scatter([x_of(r) for r in dominated], [r["usd_per_m_samples"] for r in dominated], color="lightgrey",
                 label="dominated")
    axes.plot([x_of(r) for r in front], [r["usd_per_m_samples"] for r in front], "o-", color="tab:blue",
              label="Pareto front")
    for i, r in enumerate(front):   # labels alternate above and below, so neighbours on the front do not overlap
        axes.annotate(short(r["option"]), (x_of(r), r["usd_per_m_samples"]), fontsize=7,
                      xytext=(4, 5 if i % 2 == 0 else -11), textcoords="offset points")
    costs = [r["usd_per_m_samples"] for r in rows]
    if costs and min(costs) > 0 and max(costs) / min(costs) > 20:
        axes.set_yscale("log")
    axes.set_xlabel("hours to finish" if by_epochs else "hours per million samples")
    axes.set_ylabel("USD per million samples")
    axes.set_title(f"gpurig choose: {result['model']}, {result['precision']}, ranked by {result['objective']}",
                   fontsize=9)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
