"""Every option a caller can set, once: its default, what it allows and one line of help.

One table per family (SIMILARITY, ENTROPY, LENS, STITCH, CAPTURE, TRAIN, DATASETS, LABELS, PROBE,
SERVE, GC, BATCHES, SQL, IMPORTS, PROGRESSION). The CLI builds its flags from them (default, choices, and help
that shows the default), the client
takes its keyword defaults from them, and the server resolves every request option through them,
so a default is written here and nowhere else. tests/test_options.py checks that the CLI and the
client agree with the tables.

    resolve(ENTROPY, "alpha", None)      -> 1.0 (the default)
    resolve(ENTROPY, "alpha", -1.0)      -> InvalidArgument: alpha -1.0 must be > 0
    resolve(ENTROPY, "permutations", 10**9, limits=settings)
                                         -> ResourceExhausted: over the server's max_dime_permutations
    from_wire(ENTROPY, "alpha", 0.0)     -> 1.0 (proto3: a zero value means "not given")
    from_message(ENTROPY, "alpha", EntropyRequest(alpha=0.0))
                                         -> InvalidArgument (an `optional` field set to 0 is given)

Every float must be finite. An option's `limit` names the server setting (actstore.config.Settings)
that caps it; the server passes its settings as `limits`, so the cap is enforced where the request
is resolved, and a client (which does not know the server's settings) checks only the table.

A default of None means "decided elsewhere": by the server from the request (pooling follows the
model), by its settings (max_len), or the option is required (batch_size); `default_text` says
which for the help.

Pure Python; imports only actstore.errors, so the thin client can use it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from actstore.errors import InvalidArgument, ResourceExhausted

__all__ = [
    "BATCHES", "CAPTURE", "DATASETS", "ENTROPY", "GC", "IMPORTS", "LABELS", "LENS", "PROBE", "PROGRESSION", "SERVE",
    "SIMILARITY", "SQL", "STITCH", "TABLES", "TRAIN", "TYPE_NAMES", "UNCERTAINTY",
    "Option", "Table", "comma_separated", "duration_seconds", "from_message", "from_wire", "given_in_message",
    "resolve",
    "trained_model_name",
]


TYPE_NAMES = {bool: "a bool", int: "an int", float: "a float", str: "a string"}  # for the messages


@dataclass(frozen=True)
class Option:
    """One option. `type` is bool, int, float or str; `many` makes it a list of that type, each
    element checked. Bounds are inclusive unless `exclusive` (then minimum < v < maximum)."""

    name: str
    type: type
    default: Any = None
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    exclusive: bool = False
    many: bool = False
    split: bool = False  # a list of names that may be written comma-separated (`comma_separated`)
    help: str = ""
    default_text: str | None = None  # how to describe a default of None (or a clearer wording)
    limit: str | None = None  # the Settings field that caps the value on the server (ACTSTORE_<LIMIT>)
    hint: str = ""  # what to ask for instead, appended to the message refusing a value out of bounds

    @property
    def described_default(self) -> str | None:
        """What the help says the default is; None when there is nothing to say (a flag)."""
        if self.default_text is not None:
            return self.default_text
        if self.default is None or self.type is bool:
            return None
        if self.many:
            return ", ".join(str(v) for v in self.default)
        return str(self.default)

    def help_text(self, extra: str = "") -> str:
        """The option's help with its default, e.g. 'Renyi order, 1 = Shannon (default 1.0)'."""
        text = " ".join(t for t in (self.help, extra) if t)
        default = self.described_default
        if default is None:
            return text
        return f"{text} (default: {default})" if self.default_text is not None else f"{text} (default {default})"

    def check(self, value: Any, limits: Any = None) -> Any:
        """`value` validated and normalised (an int for a float option becomes a float; a list
        option becomes a list), or InvalidArgument naming the option and what it allows. With
        `limits` (the server's Settings), a value over the setting named by `limit` is
        ResourceExhausted naming the setting. A `split` option's values are parsed here, and only
        here: "a, b", ["a", "b"] and ["a,b"] are all ["a", "b"] (`comma_separated`)."""
        if self.many:
            if self.split:
                value = comma_separated(value)
            if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
                raise InvalidArgument(f"{self.name} must be a list of {self.type.__name__} values, got {value!r}")
            return [self._check_one(v, limits) for v in value]
        return self._check_one(value, limits)

    def _check_one(self, value: Any, limits: Any = None) -> Any:
        value = self._checked(value)
        if self.limit is not None and limits is not None and value > getattr(limits, self.limit):
            raise ResourceExhausted(f"{self.name} {value!r} is over this server's limit of "
                                    f"{getattr(limits, self.limit)} (ACTSTORE_{self.limit.upper()}): ask for less")
        return value

    def _checked(self, value: Any) -> Any:
        value = self._coerce(value)
        if self.type is float and not math.isfinite(value):
            raise InvalidArgument(f"{self.name} must be a finite number, got {value!r}")
        if self.choices is not None and value not in self.choices:
            raise InvalidArgument(f"{self.name} {value!r} is not one of {', '.join(self.choices)}")
        if self.minimum is not None or self.maximum is not None:
            low = self.minimum is not None and (value <= self.minimum if self.exclusive else value < self.minimum)
            high = self.maximum is not None and (value >= self.maximum if self.exclusive else value > self.maximum)
            if low or high:
                what = f"{self.name} value" if self.many else self.name
                raise InvalidArgument(f"{what} {value!r} must be {self.bounds_text()}"
                                      + (f": {self.hint}" if self.hint else ""))
        return value

    def bounds_text(self) -> str:
        lo, hi = self.minimum, self.maximum
        if lo is not None and hi is not None:
            return f"in ({lo}, {hi})" if self.exclusive else f"in [{lo}, {hi}]"
        if lo is not None:
            return f"> {lo}" if self.exclusive else f">= {lo}"
        return f"< {hi}" if self.exclusive else f"<= {hi}"

    def _coerce(self, value: Any) -> Any:
        kind = self.type
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, bool) and kind is not bool:  # True is an int to Python, not to a caller
            raise InvalidArgument(f"{self.name} must be {TYPE_NAMES[kind]}, got {value!r}")
        if kind is int and hasattr(value, "__index__"):  # numpy integers
            return int(value)
        if kind is float and isinstance(value, float):
            return float(value)
        if not isinstance(value, kind):
            raise InvalidArgument(f"{self.name} must be {TYPE_NAMES[kind]}, got {value!r}")
        return value


class Table(Mapping[str, Option]):
    """The options of one family, by name; `TABLE.name` is the Option too."""

    def __init__(self, family: str, *options: Option) -> None:
        self.family = family
        self._options = {o.name: o for o in options}
        if len(self._options) != len(options):
            raise ValueError(f"{family}: an option is listed twice")
        for option in options:  # the table itself must be consistent
            if option.default is not None:
                option.check(option.default)

    def __getitem__(self, name: str) -> Option:
        try:
            return self._options[name]
        except KeyError:
            raise KeyError(f"{self.family} has no option {name!r}") from None

    def __getattr__(self, name: str) -> Option:
        options = self.__dict__.get("_options", {})
        if name in options:
            return options[name]
        raise AttributeError(f"{self.__dict__.get('family', 'table')} has no option {name!r}")

    def __iter__(self) -> Iterator[str]:
        return iter(self._options)

    def __len__(self) -> int:
        return len(self._options)

    def __repr__(self) -> str:
        return f"Table({self.family!r}, {', '.join(self._options)})"

    def defaults(self) -> dict[str, Any]:
        return {name: option.default for name, option in self._options.items()}

    def resolve(self, name: str, value: Any = None) -> Any:
        return resolve(self, name, value)


def comma_separated(value: Any) -> Any:
    """The names of a comma-separated list option: a string or a list of strings, each split at its
    commas and stripped, empty names dropped, each name once in order ("a, b", ["a", "b"] and
    ["a,b", "a"] are all ["a", "b"]). Anything else is returned as it is, for `Option.check` to refuse."""
    items = [value] if isinstance(value, str) else value
    if isinstance(items, bytes) or not isinstance(items, Sequence):
        return value
    chosen: list = []
    for item in items:
        for part in ((p.strip() for p in item.split(",")) if isinstance(item, str) else (item,)):
            if part != "" and part not in chosen:
                chosen.append(part)
    return chosen


def resolve(table: Table, name: str, value: Any = None, limits: Any = None) -> Any:
    """`value`, validated (capped by `limits`, the server's Settings, where the option has a
    `limit`), or the option's default when `value` is None."""
    option = table[name]
    if value is None:
        return list(option.default) if option.many and option.default is not None else option.default
    return option.check(value, limits)


def from_wire(table: Table, name: str, value: Any, limits: Any = None) -> Any:
    """Resolve a proto3 field: its zero value ("" / 0 / 0.0 / False / []) means not given."""
    return resolve(table, name, value if value else None, limits)


def given_in_message(message: Any, names: Iterable[str]) -> dict[str, Any]:
    """The options `names` as a request message gives them (None: not given). A field with
    presence (`optional` in the .proto: the numeric options whose 0 is no valid value) is given
    when set, 0 included, so the table refuses an explicit 0 as the CLI and client do; in any other
    field the proto3 zero value ("" / 0 / 0.0 / False / []) means not given. Repeated fields come
    as lists."""
    given = {}
    for name in names:
        value = getattr(message, name)
        if message.DESCRIPTOR.fields_by_name[name].has_presence:
            given[name] = value if message.HasField(name) else None
        else:
            given[name] = (list(value) if not isinstance(value, (str, bytes, int, float)) else value) or None
    return given


def from_message(table: Table, name: str, message: Any, limits: Any = None) -> Any:
    """Resolve field `name` of a request message (`given_in_message` says when it is given)."""
    return resolve(table, name, given_in_message(message, [name])[name], limits)


_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def duration_seconds(text: str) -> float:
    """'90s', '30m', '12h', '7d', '2w' (or '1.5h') in seconds; InvalidArgument otherwise."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if found is None:
        raise InvalidArgument(f"age {text!r} is not a number with a unit s, m, h, d or w (e.g. 30m, 12h, 7d)")
    return float(found[1]) * _UNIT_SECONDS[found[2]]


# ---- the tables ---------------------------------------------------------------------------------
SIMILARITY = Table(
    "similarity",
    Option("center", str, "global-mean", choices=("global-mean", "none"),
           help="COS: subtract the mean over samples first, or not"),
    Option("batch_size", int, None, minimum=4, help="minibatch CKA: rows per batch (required)"),
    Option("remainder", str, "drop", choices=("drop", "merge"),
           help="minibatch CKA: drop the short final batch or merge it into the one before"),
    Option("k", int, 10, minimum=1, help="kNN measures (mutual kNN, cycle kNN, CKNNA): neighbours"),
    Option("align", str, "none", choices=("none", "words", "spans"),
           help="CKA/COS of token-level runs of different tokenizers: rows are the (sample, word) pairs both "
                "share, or the finest character spans both tokenizations can be cut at (docs/metrics.md)"),
    Option("word_pool", str, "mean", choices=("mean", "last"),
           help="--align: a word's (span's) vector is the mean of its tokens or its last token"),
    Option("debiased", bool, False, help="show debiased CKA instead of biased (both are computed)"),
    Option("measure", str, None, help="a registered measure's similarity-repository identifier (actstore measures "
           "lists them; the registry, actstore.measures, checks it)"),
    Option("alpha", float, 1.0, minimum=0, maximum=1,
           help="shape metric: partial whitening, 1 = none (Procrustes), 0 = full (CCA-like)"),
    Option("sigma_fraction", float, 1.0, minimum=0, exclusive=True,
           help="RBF CKA: kernel bandwidth as a fraction of the median pairwise distance"),
    Option("require_bound", bool, False, help="refuse (FAILED_PRECONDITION) an answer over a lossily stored (int8) "
           "run that carries no error bound, instead of answering with the run's error figures"),
)

UNCERTAINTY = Table(
    "uncertainty",
    Option("bootstrap", int, 0, minimum=0, help="Poisson-bootstrap replicates for percentile intervals (0: none)",
           limit="max_bootstrap_replicates"),
    Option("ci", float, 0.95, minimum=0, maximum=1, exclusive=True, help="confidence level of the intervals"),
    Option("seed", int, 0, minimum=0, help="seed of the bootstrap weights and the null's permutations"),
    Option("null", int, 0, minimum=0, help="CKA: permutations of B's rows for the null and the calibrated score "
           "(0: none)", limit="max_null_permutations"),
    Option("standardize", bool, False, help="z-score every dimension (over all samples) before comparing"),
    Option("exclude_dims", int, None, minimum=0, many=True, help="leave these dimensions out, e.g. 12,301",
           default_text="none"),
    Option("exclude_outliers", bool, False, help="leave each layer's outlier dimensions out (RMS outlier_sigmas stds "
           "above the mean RMS over dimensions and >= 2x the median RMS: docs/metrics.md)"),
    Option("outlier_sigmas", float, 3.0, minimum=0, exclusive=True,
           help="outlier rule: standard deviations of the dimensions' RMS above their mean"),
    Option("top_k", int, 5, minimum=1, help="outliers: dimensions listed per layer, by |mean|/std"),
    Option("bootstrap_method", str, "auto", choices=("auto", "exact", "grouped"),
           help="CKA: exact = per-sample Poisson weights (Gram space, cost grows with n^2); grouped = "
                "Poisson weights on random groups of samples (feature space, cost independent of n); auto = "
                "exact while its modelled cost is within 3x the plain query or below grouped's"),
    Option("bootstrap_groups", int, 48, minimum=2, maximum=512,
           help="grouped bootstrap: random groups G (the standard error's relative error ~ 1/sqrt(2(G-1))); "
                "fewer, down to 16, when memory needs"),
)

ENTROPY = Table(
    "entropy",
    Option("metric", str, None, choices=("dataset_entropy", "prompt_entropy", "effective_rank", "curvature",
                                         "infonce", "dime", "lidar")),
    Option("alpha", float, 1.0, minimum=0, exclusive=True, help="Renyi order, 1 = Shannon",
           hint="for the log-rank limit (alpha -> 0) ask for a small alpha such as 1e-6"),
    Option("normalization", str, "raw", choices=("raw", "maxEntropy", "logN", "logD"),
           help="divide the entropy by nothing, its maximum, log N or log D"),
    Option("clamp", bool, False, help="clamp the Gram at 0 (as the reference code does)"),
    Option("convention", str, "diff-erank", choices=("diff-erank", "roy-vetterli"),
           help="effective rank: which definition"),
    Option("abs_cos", bool, False, help="curvature: |cos| inside the arccos"),
    Option("permutations", int, 10, minimum=1, help="DiME permutations", limit="max_dime_permutations"),
    Option("seed", int, 0, minimum=0, help="DiME permutation seed"),
    Option("exp", bool, False, help="LiDAR: report exp(entropy)"),
    Option("temperature", float, 0.1, minimum=0, exclusive=True, help="InfoNCE temperature"),
    Option("preset", str, "none", choices=("none", "skean2025"),
           help="a reference pipeline by name: skean2025 = the Layer by Layer code (token-level run; "
                "dataset_entropy, prompt_entropy, curvature; docs/metrics.md)"),
    Option("align", str, "none", choices=("none", "words"),
           help="token-level run: pool its tokens to the words of the text first (dataset entropy and effective "
                "rank over word vectors, prompt entropy and curvature over each prompt's words), so models with "
                "different tokenizers give curves over the same units"),
    SIMILARITY.word_pool,
)

LENS = Table(
    "lens",
    Option("epsilon", float, 0.1, minimum=0, maximum=1, exclusive=True, help="effective depth tolerance"),
    Option("taus", float, (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99), minimum=0, maximum=1, many=True,
           help="exit confidence thresholds, e.g. 0.5,0.8,0.9", default_text="0.5..0.99"),
    Option("heads", str, "shared", choices=("shared", "exits"),
           help="the model's one head at every layer, or a multi-exit model's own exits"),
    Option("rcond", float, 1e-10, minimum=0, exclusive=True,
           help="NC1: relative pseudo-inverse threshold"),
)

STITCH = Table(
    "stitch",
    Option("test_fraction", float, 0.25, minimum=0, maximum=1, exclusive=True,
           help="held-out prompts for the penalty"),
    Option("seed", int, 0, minimum=0, help="split seed (and the tuning batches' shuffle)"),
    Option("tune_steps", int, 0, minimum=0, help="Adam steps of the affine map on B's task loss after the "
           "least-squares fit (0: no tuning)", limit="max_stitch_tune_steps"),
    Option("tune_lr", float, 1e-3, minimum=0, exclusive=True, help="learning rate of the tuning steps"),
)

CAPTURE = Table(
    "capture",
    Option("pooling", str, None, choices=("cls", "last", "mean", "tokens"),
           help="what is stored per sample", default_text="cls for encoders and vision, last for causal LMs"),
    Option("dtype", str, "float16", choices=("float16", "float32", "bfloat16", "int8"),
           help="storage dtype; int8: one byte a value, scaled per channel and shard, with an error bound every CKA "
                "answer over the run carries (docs/one-byte-storage.md)"),
    Option("max_cka_error", float, None, minimum=0, maximum=1, exclusive=True,
           help="int8: the largest CKA error bound a layer may have; a layer over it is stored exactly (float32) "
                "instead, with a second pass over the data", default_text="none: every layer int8",
           hint="a bound on |CKA - the exact values' CKA|, each layer's side of it, e.g. 1e-3"),
    Option("max_len", int, None, minimum=2, help="token limit",
           default_text="the server's default_max_len, 128 unless configured"),
    Option("site", str, ("resid_post",), many=True, split=True,
           help="capture sites, comma-separated, all from one forward pass (one run each): resid_post (the "
                "block's output), attn_out, mlp_out (what attention / the MLP adds to the stream), or a module "
                "path pattern of the model with * for the block index (model.layers.*.mlp.down_proj)"),
)

TRAIN = Table(
    "train",
    Option("recipe", str, None, choices=("vit-fmnist", "minilm-rt", "gpt2-austen")),
    Option("method", str, None, choices=("standard", "aligned", "multi-exit", "ce-reg")),
    Option("seed", int, 0, minimum=0, help="training seed"),
    Option("steps", int, None, minimum=1, help="optimizer steps", default_text="the recipe's"),
    Option("smoke", bool, False, help="the recipe's tiny size (seconds)"),
    Option("alternating", bool, False, help="aligned: last-layer CE on odd steps"),
    Option("weights", str, "linear", choices=("linear", "uniform"), help="aligned layer weights"),
    Option("beta", float, None, minimum=0, help="ce-reg: weight of the cosine regulariser",
           default_text="the recipe's"),
)


def trained_model_name(recipe: str, method: str, seed: int, smoke: bool = False, steps: int | None = None,
                       alternating: bool = False, weights: str | None = None, beta: float | None = None) -> str:
    """The name a training run's models take (each checkpoint is NAME@stepK): every option that
    changes what is trained is in it when it is not the default, so two runs never share a name
    (a run with other steps moved the first's @stepK names onto its own checkpoints):
    RECIPE[-smoke]-METHOD[-betaB][-alternating][-weights-W][-stepsN]-sSEED."""
    parts = [recipe + ("-smoke" if smoke else ""), method]
    parts += [] if beta is None else [f"beta{beta:g}"]
    parts += ["alternating"] if alternating else []
    parts += [] if weights in (None, "", TRAIN.weights.default) else [f"weights-{weights}"]
    parts += [] if not steps else [f"steps{steps}"]
    return "-".join(parts + [f"s{seed}"])


PROGRESSION = Table(
    "progression",
    Option("metric", str, "cka-to-final", choices=("cka-to-final", "dataset-entropy", "lens-accuracy"),
           help="per layer at every training step: CKA to the final step's same layer, dataset entropy, or "
                "logit-lens accuracy"),
)

DATASETS = Table(
    "datasets",
    Option("limit", int, None, minimum=1, help="keep the first N samples (builtins: after a seeded shuffle)",
           default_text="all"),
    Option("seed", int, 0, minimum=0, help="shuffle and augmentation seed"),
    Option("text_column", str, "text", help="files: the text column"),
    Option("augment_views", int, 0, minimum=0, help="make N seeded augmentations of each text (> 1)",
           limit="max_augment_views"),
    Option("augment_method", str, "word-dropout", choices=("word-dropout", "word-swap"),
           help="how --augment-views changes a text"),
)

LABELS = Table(
    "labels",
    Option("id_column", str, "id", help="the column of the sample ids (the dataset's: `actstore read` shows them)"),
    Option("label_column", str, "label", help="the column of the labels (an empty cell leaves a sample unlabelled)"),
    Option("kind", str, "auto", choices=("auto", "categorical", "continuous"),
           help="classes or numbers; auto: numbers of which one is not an integer are continuous, anything else "
                "categorical"),
)

PROBE = Table(
    "probe",
    Option("labels", str, None, help="a label set registered for the run's dataset (register-labels), by name or "
           "digest", default_text="the dataset's own labels"),
    Option("method", str, "ridge", choices=("ridge", "logistic"),
           help="ridge: streamed per-fold moments, any n (RidgeClassifier / Ridge); logistic: multinomial L2 "
                "by L-BFGS over the rows in memory (classes only)"),
    Option("folds", int, 5, minimum=2, maximum=100, help="cross-validation folds (from the sample ids, stratified; "
           "the same for every run of a dataset)"),
    Option("alpha", float, None, minimum=0, exclusive=True, help="ridge strength; without it, one per fold is "
           "picked from --alphas by an inner cross-validation", default_text="picked from --alphas"),
    Option("alphas", float, tuple(float(10.0 ** (k / 2)) for k in range(-6, 7)), minimum=0, exclusive=True,
           many=True, help="ridge strengths the inner cross-validation picks from", default_text="10^-3..10^3, 13 "
           "values"),
    Option("C", float, 1.0, minimum=0, exclusive=True, help="logistic: inverse L2 strength (scikit-learn's C)"),
    Option("tol", float, 1e-4, minimum=0, exclusive=True, help="logistic: L-BFGS gradient tolerance"),
    Option("max_iter", int, 1000, minimum=1, help="logistic: most L-BFGS iterations"),
    Option("pool", str, None, choices=("mean", "last", "cls"), help="a token-level run's rows pooled to one per "
           "sample first: the mean, the last or the first token (required for token-level runs)",
           default_text="none (pooled runs)"),
    Option("control", bool, False, help="also probe a control task (the labels permuted, class sizes kept) and "
           "report selectivity = score - control score (Hewitt and Liang 2019)"),
    Option("control_seed", int, 0, minimum=0, help="seed of the control task's permutation"),
    Option("tolerance", float, 0.01, minimum=0, help="the smallest layer whose mean score is within this of the "
           "best is reported too"),
    Option("against", str, None, many=True, split=True, help="one-run per-layer metrics to correlate with the probe "
           "score over the layers (\"Layer by Layer\"), comma-separated, e.g. dataset-entropy,curvature, or "
           "skean2025 for that preset's metrics", default_text="none"),
    UNCERTAINTY.standardize,
    UNCERTAINTY.exclude_dims,
    UNCERTAINTY.exclude_outliers,
    UNCERTAINTY.outlier_sigmas,
)

SERVE = Table(
    "serve",
    Option("metric_device", str, None, choices=("auto", "cpu", "cuda", "torch-cpu"),
           help="where metric tasks form their float64 products: auto = CUDA in tasks Ray gives a GPU share, "
                "numpy/BLAS otherwise; cpu = never a GPU; cuda = always (refused without GPUs); torch-cpu = "
                "the GPU code path on the CPU, to check agreement", default_text="auto"),
)

GC = Table(
    "gc",
    Option("older_than", str, "7d", help="cached results, partials of finished matrix jobs and failed runs older "
           "than this age go (e.g. 30m, 12h, 7d)"),
    Option("max_bytes", int, None, minimum=1, help="size budget of the cached results: beyond it the oldest go",
           default_text="none"),
    Option("apply", bool, False, help="delete; without it gc only lists what it would delete"),
)

BATCHES = Table(
    "batches",
    Option("batch_size", int, None, minimum=1, help="rows per batch (required)"),
    Option("seed", int, 0, minimum=0, help="shuffle seed (with the epoch: the shard order and the row order)"),
    Option("epoch", int, 0, minimum=0, help="epoch: each one has its own order"),
    Option("rank", int, 0, minimum=0, help="this reader's rank, 0 <= rank < world_size"),
    Option("world_size", int, 1, minimum=1, help="data-parallel readers; each row goes to exactly one"),
    Option("buffer_shards", int, 8, minimum=2, help="shards' rows the server's shuffle buffer holds at most "
           "(raised to fit one batch plus a shard)"),
    Option("drop_last", bool, False, help="drop each rank's short final batch (then not every row is read)"),
)

SQL = Table(
    "sql",
    Option("limit", int, None, minimum=1, help="rows returned at most (more: the answer says it was cut)",
           default_text="the server's sql_max_rows", limit="sql_max_rows"),
)

IMPORTS = Table(
    "imports",
    Option("format", str, None, choices=("arrays", "vllm", "saelens"),
           help="the files' layout (docs/import.md): arrays = layer_<k>.npy / .safetensors, vllm = "
                "extract_hidden_states sidecars, saelens = a cached-activations dataset",
           default_text="detected from the files"),
    Option("pooling", str, None, choices=CAPTURE.pooling.choices,
           help="per-token sources (vllm, saelens): pool each sample's tokens (cls = the first) or keep them "
                "all (tokens); arrays: the pooling they were made with",
           default_text=CAPTURE.pooling.default_text),
    Option("dtype", str, None, choices=CAPTURE.dtype.choices, help="storage dtype",
           default_text="the source's (float64 is stored as float32)"),
)

TABLES: dict[str, Table] = {t.family: t for t in (SIMILARITY, ENTROPY, LENS, STITCH, CAPTURE, TRAIN, DATASETS,
                                                   SERVE, GC, BATCHES, SQL, IMPORTS, UNCERTAINTY, PROGRESSION,
                                                   LABELS, PROBE)}
