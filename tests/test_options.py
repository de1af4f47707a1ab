"""Drift tests: the options tables in actstore.options are the one place a default or a choice is
written. The CLI's flags, the client's keyword defaults, the servicer's handling of a request that
leaves an option out, and the server's own constants must all agree with them."""

from __future__ import annotations

import argparse
import inspect
import math
import re
from typing import get_args

import pytest

from actstore import measures
from actstore.config import Settings
from actstore.errors import InvalidArgument, ResourceExhausted
from actstore.options import (
    BATCHES,
    CAPTURE,
    DATASETS,
    ENTROPY,
    GC,
    IMPORTS,
    LABELS,
    LENS,
    PROBE,
    PROGRESSION,
    SERVE,
    SIMILARITY,
    SQL,
    STITCH,
    TABLES,
    TRAIN,
    UNCERTAINTY,
    Option,
    from_message,
    from_wire,
    given_in_message,
    resolve,
)
from actstore.server.queries import QueryEngine
from actstore.server.readers import Readers
from actstore.server.requests import (
    EntropyQuery,
    LensQuery,
    NeuralCollapseQuery,
    SimilarityQuery,
    StitchQuery,
)

ALL_OPTIONS = [(table, name) for table in TABLES.values() for name in table]


# ---- the tables themselves ------------------------------------------------------------------------
@pytest.mark.parametrize(("table", "name"), ALL_OPTIONS, ids=lambda x: getattr(x, "family", x))
def test_every_option_is_well_formed(table, name):
    option = table[name]
    assert option.name == name and name.isidentifier()
    assert option.type in (bool, int, float, str)
    assert getattr(table, name) is option
    if option.default is not None:
        assert resolve(table, name, None) == (list(option.default) if option.many else option.default)
        assert type(option.default if not option.many else option.default[0]) is option.type
    if option.choices is not None:
        assert option.type is str and len(set(option.choices)) == len(option.choices)
    if option.type is bool:
        assert option.default is False  # a CLI flag (store_true) can only turn it on


def test_resolve_applies_the_default_and_validates():
    assert resolve(ENTROPY, "alpha", None) == 1.0
    assert resolve(ENTROPY, "alpha", 2) == 2.0 and isinstance(resolve(ENTROPY, "alpha", 2), float)
    assert resolve(SIMILARITY, "center", "none") == "none"
    assert resolve(LENS, "taus", None) == [0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99]
    assert resolve(LENS, "taus", (0.9, 0.5)) == [0.9, 0.5]
    assert resolve(CAPTURE, "pooling", None) is None  # decided by the server from the model
    assert ENTROPY.resolve("permutations", 3) == 3
    cases = [
        (SIMILARITY, "center", "middle", r"center 'middle' is not one of global-mean, none"),
        (SIMILARITY, "batch_size", 2, r"batch_size 2 must be >= 4"),
        (SIMILARITY, "remainder", "keep", r"remainder 'keep' is not one of drop, merge"),
        (ENTROPY, "alpha", 0.0, r"alpha 0.0 must be > 0"),
        (ENTROPY, "alpha", math.nan, r"alpha must be a finite number, got nan"),
        (ENTROPY, "temperature", math.inf, r"temperature must be a finite number, got inf"),
        (LENS, "taus", [0.5, math.nan], r"taus must be a finite number, got nan"),
        (ENTROPY, "seed", True, r"seed must be an int, got True"),
        (ENTROPY, "permutations", 2.5, r"permutations must be an int"),
        (LENS, "epsilon", 1, r"epsilon 1.0 must be in \(0, 1\)"),
        (LENS, "taus", [0.5, 1.5], r"taus value 1.5 must be in \[0, 1\]"),
        (LENS, "taus", "0.5", r"taus must be a list"),
        (STITCH, "test_fraction", 0.0, r"test_fraction 0.0 must be in \(0, 1\)"),
        (CAPTURE, "dtype", "int4", r"dtype 'int4' is not one of float16, float32, bfloat16, int8"),
        (CAPTURE, "max_len", 1, r"max_len 1 must be >= 2"),
        (TRAIN, "steps", 0, r"steps 0 must be >= 1"),
        (DATASETS, "augment_method", "shuffle", r"augment_method 'shuffle' is not one of"),
    ]
    for table, name, value, message in cases:
        with pytest.raises(InvalidArgument, match=message):
            resolve(table, name, value)
    with pytest.raises(KeyError, match="no option 'nope'"):
        resolve(ENTROPY, "nope", 1)


def test_every_float_must_be_finite_even_without_bounds():
    unbounded = Option("scale", float, 1.0)
    for value in (math.nan, math.inf, -math.inf):
        with pytest.raises(InvalidArgument, match="must be a finite number"):
            unbounded.check(value)


def test_a_limit_names_a_setting_that_caps_the_value_on_the_server():

    limited = [option for table in TABLES.values() for option in table.values() if option.limit]
    assert {o.name for o in limited} >= {"permutations", "augment_views"}
    for option in limited:
        assert option.limit in Settings.model_fields, option.limit
    settings = Settings(max_dime_permutations=50)
    assert resolve(ENTROPY, "permutations", 50, limits=settings) == 50
    assert resolve(ENTROPY, "permutations", 10**9) == 10**9  # a client does not know the server's limit
    with pytest.raises(ResourceExhausted, match=r"permutations 51 is over this server's limit of 50 "
                                                r"\(ACTSTORE_MAX_DIME_PERMUTATIONS\)"):
        from_wire(ENTROPY, "permutations", 51, limits=settings)


def test_a_proto3_zero_means_not_given():
    assert from_wire(ENTROPY, "alpha", 0.0) == 1.0
    assert from_wire(ENTROPY, "normalization", "") == "raw"
    assert from_wire(SIMILARITY, "k", 0) == 10
    assert from_wire(LENS, "taus", []) == list(LENS.taus.default)
    assert from_wire(DATASETS, "limit", 0) is None
    assert from_wire(ENTROPY, "clamp", False) is False and from_wire(ENTROPY, "clamp", True) is True
    with pytest.raises(InvalidArgument):
        from_wire(CAPTURE, "max_len", -5)


def test_help_shows_the_default():
    assert ENTROPY.alpha.help_text().endswith("(default 1.0)")
    assert CAPTURE.pooling.help_text().endswith("(default: cls for encoders and vision, last for causal LMs)")
    assert ENTROPY.clamp.help_text() == ENTROPY.clamp.help  # a flag: nothing to show
    assert Option("x", int, 3, help="h").help_text("more") == "h more (default 3)"


# ---- the server's own constants ---------------------------------------------------------------------
def test_choices_match_what_the_server_knows():
    from actstore._proto.actstore.v1 import actstore_pb2 as pb
    from actstore.metrics.similarity import MIN_HSIC_SAMPLES
    from actstore.store.datasets import AUGMENT_METHODS
    from actstore.store.keys import POOLINGS, STORAGE_DTYPES
    from actstore.training import METHODS, WEIGHT_SCHEMES
    from actstore.training.recipes import RECIPES
    from actstore.workers.importers import FORMATS

    assert CAPTURE.pooling.choices == POOLINGS
    assert CAPTURE.dtype.choices == STORAGE_DTYPES
    assert TRAIN.method.choices == METHODS
    assert TRAIN.weights.choices == WEIGHT_SCHEMES
    assert TRAIN.recipe.choices == tuple(RECIPES)
    assert DATASETS.augment_method.choices == AUGMENT_METHODS
    assert IMPORTS.pooling.choices == POOLINGS and IMPORTS.dtype.choices == STORAGE_DTYPES
    assert IMPORTS.format.choices == FORMATS
    assert SIMILARITY.batch_size.minimum == MIN_HSIC_SAMPLES
    assert ENTROPY.metric.choices == tuple(k.lower() for k in pb.EntropyRequest.Metric.keys()[1:])
    fields = Settings.model_fields
    assert SERVE.metric_device.choices == get_args(fields["metric_device"].annotation)
    assert SERVE.metric_device.default_text == fields["metric_device"].default
    max_len = fields["default_max_len"]
    assert str(max_len.default) in CAPTURE.max_len.default_text
    assert [m.ge for m in max_len.metadata if hasattr(m, "ge")] == [CAPTURE.max_len.minimum]


def test_cli_roles_are_the_servers():
    from actstore.cli.admin import ROLES
    from actstore.server.auth import ROLES as SERVER_ROLES

    assert ROLES == SERVER_ROLES


# ---- the CLI ----------------------------------------------------------------------------------------
# command -> the tables its flags come from, and the option names it must have
CLI = {
    "serve": ([SERVE], {"metric_device"}),
    "experiment": ([TRAIN, LENS], {"recipe", "steps", "smoke", "epsilon", "beta"}),
    "register-dataset": ([DATASETS], {"limit", "seed", "text_column", "augment_views", "augment_method"}),
    "capture": ([CAPTURE], {"pooling", "dtype", "max_len", "site", "max_cka_error"}),
    "train": ([TRAIN], set(TRAIN)),
    "cka": ([SIMILARITY, UNCERTAINTY], {"debiased", "bootstrap", "ci", "seed", "null", "standardize",
                                        "exclude_dims", "exclude_outliers", "outlier_sigmas", "align", "word_pool",
                                        "bootstrap_method", "bootstrap_groups"}),
    "cos": ([SIMILARITY, UNCERTAINTY], {"center", "bootstrap", "ci", "seed", "standardize", "exclude_dims",
                                        "exclude_outliers", "outlier_sigmas", "align", "word_pool", "require_bound"}),
    "outliers": ([UNCERTAINTY], {"top_k", "outlier_sigmas"}),
    "minibatch-cka": ([SIMILARITY], {"batch_size", "remainder", "require_bound"}),
    "knn": ([SIMILARITY], {"k", "require_bound"}),
    "cka-matrix": ([SIMILARITY], {"debiased", "measure", "alpha"}),
    "similarity": ([SIMILARITY], {"measure", "alpha", "sigma_fraction", "k", "require_bound"}),
    "entropy": ([ENTROPY], set(ENTROPY)),
    "lens": ([LENS], {"epsilon", "taus", "heads"}),
    "nc1": ([LENS], set()),
    "stitch": ([STITCH], set(STITCH)),
    "progression": ([PROGRESSION, CAPTURE], {"metric", "pooling", "max_len"}),
    "gc": ([GC], set(GC)),
    "sql": ([SQL], {"limit"}),
    "import": ([IMPORTS], set(IMPORTS)),
    "register-labels": ([LABELS], set(LABELS)),
    "probe": ([PROBE], set(PROBE)),
}
CLI_OWN_DEFAULTS = {("experiment", "recipe"): "vit-fmnist"}  # the experiment picks a recipe; train does not
CLI_OWN_CHOICES = {  # the matrix job computes the streamed measures, and the registry lists them
    ("cka-matrix", "measure"): tuple(m.identifier for m in measures.measures(measures.MOMENTS))}


def _commands() -> dict[str, argparse.ArgumentParser]:
    from actstore.cli import build_parser

    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_every_command_is_covered_or_has_no_table_options():
    commands = _commands()
    names = {name for table in TABLES.values() for name in table}
    for command, parser in commands.items():
        if command in CLI:
            continue
        dests = {a.dest for a in parser._actions} - {"address", "store", "token", "verbose", "help"}
        # a command outside CLI may share a name with an option only by coincidence of meaning
        assert not dests & names - {"run", "name", "seed", "site"}, (command, dests & names)


@pytest.mark.parametrize("command", list(CLI))
def test_cli_flags_match_the_tables(command):
    tables, expected = CLI[command]
    parser = _commands()[command]
    seen = set()
    for action in parser._actions:
        table = next((t for t in tables if action.dest in t), None)
        if table is None:
            continue
        option = table[action.dest]
        seen.add(action.dest)
        if option.name == "metric":  # positional, with the dashed spelling of the names
            assert action.choices == [m.replace("_", "-") for m in option.choices]
            continue
        if option.type is bool:
            assert isinstance(action, argparse._StoreTrueAction), action
            assert action.default is option.default
            continue
        if option.many:
            assert action.default is None  # the server's default, shown in the help
            sample = "0.5,0.9" if option.type is float else "12,301"
            assert action.type(sample) == [option.type(v) for v in sample.split(",")]
        else:
            assert action.default == CLI_OWN_DEFAULTS.get((command, option.name), option.default), action
            if option.choices is not None:  # argparse checks the choices
                assert action.type in (option.type, None if option.type is str else option.type), action
            elif option.default is not None:
                assert action.type(str(option.default)) == option.default, action
        assert tuple(action.choices or ()) == CLI_OWN_CHOICES.get((command, option.name), option.choices or ()), action
        shown = option.described_default
        if shown is not None and (command, option.name) not in CLI_OWN_DEFAULTS:
            assert f"default {shown}" in action.help or f"default: {shown}" in action.help, action.help
    assert seen == expected, (command, seen ^ expected)


def _out_of_bounds(option):
    """A value just outside the option's bounds (None: it has none), as the command line spells it."""
    if option.minimum is not None:
        low = option.minimum if option.exclusive else option.minimum - (1 if option.type is int else 1e-3)
        return str(option.type(low))
    if option.maximum is not None:
        return str(option.type(option.maximum if option.exclusive else option.maximum + 1))
    return None


@pytest.mark.parametrize("command", list(CLI))
def test_cli_flags_refuse_what_the_tables_refuse(command):
    """Every flag from a table checks its value there: a 0 that the request would carry as "not
    given" (and the server would answer with the default) is a usage error, not the default."""
    tables, _ = CLI[command]
    for action in _commands()[command]._actions:
        table = next((t for t in tables if action.dest in t), None)
        if table is None or table[action.dest].type is bool or table[action.dest].choices is not None:
            continue
        option, bad = table[action.dest], _out_of_bounds(table[action.dest])
        if bad is not None:
            with pytest.raises(argparse.ArgumentTypeError, match=f"must be {re.escape(option.bounds_text())}"):
                action.type(bad)
        if option.type is float:
            with pytest.raises(argparse.ArgumentTypeError, match="must be a finite number"):
                action.type("nan")


def test_cli_help_shows_defaults_end_to_end(capsys):
    from actstore.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["entropy", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default 1.0)" in out and "(default 0.1)" in out and "{raw,maxEntropy,logN,logD}" in out
    args = build_parser().parse_args(["lens", "RUN", "--taus", "0.9,0.5"])
    assert args.taus == [0.9, 0.5] and args.epsilon == LENS.epsilon.default


# ---- the client ---------------------------------------------------------------------------------------
CLIENT = {
    "register_dataset": (DATASETS, {"limit", "seed", "text_column", "augment_views", "augment_method"}),
    "submit_capture": (CAPTURE, set(CAPTURE)),
    "capture": (CAPTURE, set(CAPTURE)),
    "plan_capture": (CAPTURE, set(CAPTURE)),
    "train": (TRAIN, set(TRAIN)),
    "cos": (SIMILARITY, {"center", "align", "word_pool", "require_bound"}),
    "minibatch_cka": (SIMILARITY, {"batch_size", "remainder", "require_bound"}),
    "mutual_knn": (SIMILARITY, {"k", "require_bound"}),
    # its own options come as **options, checked by the measure's spec
    "measure": (SIMILARITY, {"measure", "require_bound"}),
    "measure_matrix": (SIMILARITY, {"measure"}),
    "entropy": (ENTROPY, set(ENTROPY)),
    "lens": (LENS, {"epsilon", "taus", "heads"}),
    "neural_collapse": (LENS, {"rcond"}),
    "stitch": (STITCH, set(STITCH)),
    "collect_garbage": (GC, set(GC)),
    "batches": (BATCHES, set(BATCHES)),
    "torch_dataset": (BATCHES, set(BATCHES) - {"epoch"}),  # the epoch is set per epoch: set_epoch
    "sql": (SQL, {"limit"}),
    "submit_import": (IMPORTS, set(IMPORTS)),
    "import_activations": (IMPORTS, set(IMPORTS)),
    "cka_stats": (UNCERTAINTY, set(UNCERTAINTY) - {"top_k"}),
    "cos_stats": (UNCERTAINTY, set(UNCERTAINTY) - {"top_k", "null", "bootstrap_method", "bootstrap_groups"}),
    "outliers": (UNCERTAINTY, {"top_k", "outlier_sigmas"}),
    "progression": (PROGRESSION, set(PROGRESSION)),
    "register_labels": (LABELS, set(LABELS)),
    "probe": (PROBE, set(PROBE)),
}


@pytest.mark.parametrize("method", list(CLIENT))
def test_client_defaults_match_the_tables(method):
    from actstore.client import Client

    table, expected = CLIENT[method]
    parameters = inspect.signature(getattr(Client, method)).parameters
    assert expected <= set(parameters) and set(parameters) & set(table) == expected
    for name in expected:
        option, default = table[name], parameters[name].default
        if default is inspect.Parameter.empty:
            assert option.default is None, (method, name)  # required in the client, no default here
        elif option.many:
            assert default is None, (method, name)  # None: the server's default
        else:
            assert default == option.default and type(default) is type(option.default), (method, name, default)


def test_client_checks_the_entropy_metric_locally():
    from actstore.client import Client

    client = Client("127.0.0.1:1")
    try:
        with pytest.raises(InvalidArgument, match="metric 'entropy' is not one of dataset_entropy"):
            client.entropy("entropy", "run")
    finally:
        client.close()


# ---- the servicer ---------------------------------------------------------------------------------------
class _Called(Exception):
    pass


class _Recorder:
    """Stands in for the service and its parts (`service.captures.submit(...)`): records the call
    by the method's name and stops there. Its query engine and readers resolve a request as the
    real ones do (`_Engine`, `_Readers`), over recorded run checks."""

    def __init__(self, calls: list | None = None, name: str = ""):
        self.calls = [] if calls is None else calls
        self.name = name
        self.settings = Settings(result_messages_kept=0)  # no kept replies: every call reaches the service

    def __getattr__(self, name):
        return {"queries": _Engine, "readers": _Readers}.get(name, _Recorder)(self.calls, name)

    def __call__(self, *args, **kwargs):
        self.calls.append((self.name, args, kwargs))
        raise _Called


class _Engine(_Recorder):
    answer = QueryEngine.answer  # the call resolved into its family's typed query: the runs checked first


class _Readers(_Recorder):
    batches = Readers.batches  # the request resolved into BatchOptions: the table, then the run


def _call(servicer, method, request):
    with pytest.raises(_Called):
        result = getattr(servicer, method)(request, None)
        if inspect.isgenerator(result):
            next(result)
    return servicer.service.calls[-1]


def test_the_servicer_fills_in_the_tables_defaults():
    from actstore._proto.actstore.v1 import actstore_pb2 as pb
    from actstore.server.servicer import CaptureServicer, CatalogServicer, QueryServicer

    query = QueryServicer(_Recorder())
    # each query RPC resolves its request (the options it gives: options.given_in_message) into a typed
    # query (server/requests.py): the options the metric uses, through its table; those it does not use
    # hold the table's defaults, unread
    dime = EntropyQuery.options_of("dime", {})
    assert dime == {n: ENTROPY[n].default for n in ("alpha", "permutations", "seed", "preset", "align")}
    words = EntropyQuery.options_of("curvature", {"align": "words"})
    assert words == {"abs_cos": False, "preset": "none", "align": "words", "word_pool": "mean"}
    preset = EntropyQuery.options_of("effective_rank", {"preset": "skean2025"})
    assert set(preset) == {"alpha", "normalization", "clamp", "abs_cos", "preset", "align"}  # what it fixes
    assert LensQuery.options_of({}) == {"epsilon": 0.1, "taus": list(LENS.taus.default),
                                                             "heads": "shared"}
    assert LensQuery.options_of({"taus": [0.9, 0.5]})["taus"] == [0.5, 0.9]
    assert NeuralCollapseQuery.options_of({}) == {"rcond": 1e-10}
    assert StitchQuery.options_of({}) == \
        {"test_fraction": 0.25, "seed": 0, "tune_steps": 0, "tune_lr": 1e-3}
    # then the runs, before any planner
    for method, request, run in [("Entropy", pb.EntropyRequest(metric=pb.EntropyRequest.DIME, run="r"), "r"),
                                 ("ResidualNorm", pb.ResidualNormRequest(run="r"), "r"),
                                 ("Lens", pb.LensRequest(run="r"), "r"),
                                 ("NeuralCollapse", pb.NeuralCollapseRequest(run="r"), "r"),
                                 ("Stitch", pb.StitchRequest(run_a="a", run_b="b"), "a")]:
        assert _call(query, method, request)[:2] == ("committed_run", (run,)), method
    # the Similarity RPC resolves its request into a SimilarityQuery: the options the metric uses
    assert SimilarityQuery.options_of("cos", {})["center"] == "global-mean"
    assert SimilarityQuery.options_of("mutual_knn", {})["k"] == 10
    minibatch = SimilarityQuery.options_of("minibatch_cka", {"batch_size": 8})
    assert (minibatch["batch_size"], minibatch["remainder"]) == (8, "drop")
    name, args, _ = _call(query, "Similarity", pb.SimilarityRequest(metric=pb.SimilarityRequest.COS, run_a="r"))
    assert name == "pair" and args[0] == "r"  # then the runs and layers, before any planner

    _, args, _ = _call(CaptureServicer(_Recorder()), "SubmitCapture", pb.CaptureRequest(model="m", dataset="d"))
    assert (args[0].pooling, args[0].dtype, args[0].max_len, args[0].sites) == (None, "float16", None, ("resid_post",))
    _, args, _ = _call(CaptureServicer(_Recorder()), "SubmitTrain", pb.TrainRequest(recipe="x", method="aligned"))
    assert (args[0].weights, args[0].steps, args[0].seed) == ("linear", 0, 0)
    _, args, _ = _call(CatalogServicer(_Recorder()), "RegisterDataset", pb.RegisterDatasetRequest(builtin="b"))
    source = args[0]
    assert (source.limit, source.seed, source.text_column, source.augment_views, source.augment_method) == \
        (None, 0, "text", 0, "word-dropout")


def test_the_readers_servicer_fills_in_the_tables_defaults():
    from actstore._proto.actstore.v1 import readers_pb2 as pb
    from actstore.server.readers_servicer import ReadersServicer

    readers = ReadersServicer(_Recorder())
    # ReadBatches resolves its request into BatchOptions: the table first (a bad value is refused
    # before the run is looked up), then the run
    name, args, _ = _call(readers, "ReadBatches", pb.BatchesRequest(run="r", batch_size=4))
    assert (name, args) == ("committed_run", ("r",))
    with pytest.raises(InvalidArgument, match="buffer_shards 1 must be >= 2"):
        readers.ReadBatches(pb.BatchesRequest(run="r", batch_size=4, buffer_shards=1), None).__next__()
    _, args, _ = _call(readers, "Sql", pb.SqlRequest(query="SELECT 1"))
    assert args[:2] == ("SELECT 1", None)  # None: the server's sql_max_rows


def test_the_servicer_refuses_what_the_tables_refuse():
    from actstore._proto.actstore.v1 import actstore_pb2 as pb
    from actstore.server.servicer import CaptureServicer, QueryServicer

    query = QueryServicer(_Recorder())
    for method, request, message in [
        ("Entropy", pb.EntropyRequest(metric=pb.EntropyRequest.DIME, run="r", permutations=-1), "permutations -1"),
        ("Entropy", pb.EntropyRequest(metric=pb.EntropyRequest.LIDAR, run="r", alpha=-2), "alpha -2.0"),
        ("Lens", pb.LensRequest(run="r", heads="all"), "heads 'all'"),
        ("Stitch", pb.StitchRequest(run_a="a", run_b="b", test_fraction=2), "test_fraction 2.0"),
    ]:
        with pytest.raises(InvalidArgument, match=message):
            getattr(query, method)(request, None)
    with pytest.raises(InvalidArgument, match="dtype 'int4'"):
        CaptureServicer(_Recorder()).SubmitCapture(pb.CaptureRequest(model="m", dataset="d", dtype="int4"), None)
    # the server's limits cap an option at once; a preset with --align is refused before the run is read
    limits = Settings(max_dime_permutations=50, max_stitch_tune_steps=100)
    with pytest.raises(ResourceExhausted, match="permutations 51 is over this server's limit of 50"):
        EntropyQuery.options_of("dime", {"permutations": 51}, limits)
    with pytest.raises(ResourceExhausted, match="tune_steps 101 is over this server's limit of 100"):
        StitchQuery.options_of({"tune_steps": 101}, limits)
    with pytest.raises(InvalidArgument, match="preset skean2025 reproduces a pipeline over token rows: drop --align"):
        query.Entropy(pb.EntropyRequest(metric=pb.EntropyRequest.CURVATURE, run="r", preset="skean2025",
                                        align="words"), None)
    # an option the metric does not use is not read, as before
    assert "center" not in SimilarityQuery.options_of("cka", {"center": "bogus"})
    # an entropy request's every field is checked against the table, as before; only the metric's are kept
    assert set(EntropyQuery.options_of("dataset_entropy", {"temperature": 0.5})) == {
        "alpha", "normalization", "clamp", "preset", "align"}
    for unused in (dict(temperature=-1), dict(permutations=-1), dict(convention="bogus"), dict(word_pool="first")):
        with pytest.raises(InvalidArgument):
            EntropyQuery.options_of("dataset_entropy", unused)
    _call(query, "Similarity", pb.SimilarityRequest(metric=pb.SimilarityRequest.CKA, run_a="r", center="bogus"))


def test_a_message_gives_an_option_by_presence_or_by_a_nonzero_value():
    from actstore._proto.actstore.v1 import actstore_pb2 as pb

    # `optional` fields: given when set, 0 included (the table then refuses it); others: zero is not given
    assert given_in_message(pb.SimilarityRequest(batch_size=0, center=""), ["batch_size", "center", "k"]) == \
        {"batch_size": 0, "center": None, "k": None}
    assert given_in_message(pb.LensRequest(taus=[0.9, 0.5], heads="exits"), ["taus", "heads", "epsilon"]) == \
        {"taus": [0.9, 0.5], "heads": "exits", "epsilon": None}
    assert given_in_message(pb.EntropyRequest(clamp=True, seed=0), ["clamp", "seed"]) == {"clamp": True, "seed": None}
    with pytest.raises(InvalidArgument, match="batch_size 0 must be"):
        from_message(SIMILARITY, "batch_size", pb.SimilarityRequest(batch_size=0))
