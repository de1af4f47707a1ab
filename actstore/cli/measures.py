"""`actstore similarity MEASURE RUN_A [RUN_B]` and `actstore measures`: every registered measure
(`actstore.measures`), named by its similarity-repository identifier. The help, the flags of the
measures' options, the colour bounds of the plot and the `measures` table (every registered
metric, and the command that asks for it) all come from the registry, so a new measure module
appears here without touching this file."""

from __future__ import annotations

from actstore import measures
from actstore.cli.common import add_measure_options, add_option, connect, given_options
from actstore.cli.compare import _pair_args, show_matrix
from actstore.errors import InvalidArgument
from actstore.options import SIMILARITY

NEEDS = {needs: measures.NEEDS[needs] for needs in (measures.MOMENTS, measures.ROWS)}
# The command that asks for a metric of each query family (the registry's own measures: `similarity`).
COMMANDS = {"measure": "similarity {identifier}", "entropy": "entropy {identifier}", "residual_norm": "residual-norm",
            "lens": "lens", "neural_collapse": "nc1", "stitch": "stitch", "probe": "probe"}
SIMILARITY_COMMANDS = {"cka": "cka", "cos": "cos", "minibatch_cka": "minibatch-cka", "mutual_knn": "knn"}


def command_of(spec: measures.Measure) -> str:
    """`actstore ...`: the command that asks for `spec` (any metric: `Client.metric` in Python)."""
    found = SIMILARITY_COMMANDS.get(spec.identifier) if spec.query == "similarity" else COMMANDS.get(spec.query)
    return "actstore " + (found or "similarity {identifier}").format(identifier=spec.identifier)


def _bounds(spec: measures.Measure) -> str:
    low, high = ("" if b is None else f"{b:g}" for b in spec.bounds)
    return f"[{low or '-inf'}, {high or 'inf'}]"


def description() -> str:
    lines = ["A measure between every layer of run A (rows) and every layer of run B (columns; default A),",
             "named by its nacloos/similarity-repository identifier so results compare across tools.", ""]
    for needs, text in NEEDS.items():
        lines.append(f"From {text}:")
        for spec in measures.measures(needs):
            lines.append(f"  {spec.identifier}")
            lines.append(f"      {spec.summary}{' (distance)' if spec.distance else ''}")
        lines.append("")
    lines += ["Distances are 0 for identical representations (up to the measure's invariances); scores are 1.",
              "`actstore measures` lists every measure with its bounds, options and source.", "",
              "Examples:",
              "  actstore similarity procrustes-distance=angular RUN_A RUN_B --plot procrustes.png",
              "  actstore similarity 'shape_metric-alpha={alpha}-distance=angular' RUN --alpha 0.5",
              "  actstore cka-matrix RUN1 RUN2 --measure nbs-score     (every layer of every run, one job)"]
    return "\n".join(lines)


def cmd_similarity(args) -> int:
    spec = measures.get(args.measure)
    if spec.query != "measure":
        raise InvalidArgument(f"{spec.identifier} is not one of this command's measures: ask `{command_of(spec)}`")
    options = given_options(args, args.measure)  # a usage error before any connection
    with connect(args) as client:
        result = client.measure(args.measure, args.run_a, args.run_b, layers_a=args.layers_a,
                                layers_b=args.layers_b, refresh=args.refresh, require_bound=args.require_bound,
                                **options)
    name = result.provenance.metric
    show_matrix(name, result.values, result, args)
    return 0


def cmd_measures(args) -> int:
    """The registry as a table: the docs' list of metrics, always current."""
    rows = [("identifier", "kind", "bounds", "needs", "options", "command", "source", "summary")]
    for spec in measures.measures(query=None):
        options = ", ".join(f"{o.name}={o.default_text or o.default}" for o in spec.options) or "-"
        rows.append((spec.identifier, "distance" if spec.distance else "score", _bounds(spec), spec.needs, options,
                     command_of(spec), spec.source, spec.summary))
    if args.markdown:
        print("| " + " | ".join(rows[0]) + " |")
        print("|" + "---|" * len(rows[0]))
        for row in rows[1:]:
            print("| " + " | ".join(f"`{row[0]}`" if i == 0 else cell.replace("|", "\\|")
                                    for i, cell in enumerate(row)) + " |")
        return 0
    for identifier, kind, bounds, needs, options, command, _, summary in rows[1:]:
        print(f"{identifier}\n    {summary}\n    {kind} in {bounds}, needs {needs}; {command}\n    options: {options}")
    return 0


def add_commands(command) -> None:
    p = command("similarity", cmd_similarity, "Procrustes, CCA, NBS, regression R^2, RSA, RBF CKA, CKNNA ... by "
                "identifier", description())
    add_option(p, SIMILARITY, "measure", "measure", metavar="MEASURE", help="the measure's identifier (see above)")
    _pair_args(p)
    add_measure_options(p)
    add_option(p, SIMILARITY, "require_bound")
    p = command("measures", cmd_measures, "list every registered metric: identifier, score or distance, bounds, "
                "options, the command that asks for it", "Every metric the server computes, from the metric registry "
                "(built-in modules of actstore.measures\nand the `actstore.measures` entry points): the measures "
                "`actstore similarity` and `cka-matrix --measure`\ntake, and CKA, COS, the entropy family, the "
                "residual norm, NC1, the lens and stitching with their own\ncommands. In Python, "
                "`Client.metric(identifier, run_a, run_b, **options)` asks for any of them.")
    p.add_argument("--markdown", action="store_true", help="a Markdown table (docs/metrics.md's list of measures)")
