"""What every command group shares: where to connect, tables, and flags built from the options tables."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from actstore import measures
from actstore.errors import InvalidArgument
from actstore.options import Option, Table

DEFAULT_ADDRESS = "127.0.0.1:50151"

DESCRIPTION = """\
actstore: a shared store of transformer layer activations, with a query service that computes
CKA, cosine similarity and friends next to the stored chunks.

Where commands run:
  --address HOST:PORT   talk to a running `actstore serve` (also ACTSTORE_ADDRESS)
  --store DIR           open DIR in-process (embedded server + local Ray; ~5 s to start)
  neither               use a server on 127.0.0.1:50151 if one answers, else embed ./actstore-data

Typical session:
  actstore register-model --builtin minilm-l6
  actstore register-dataset --builtin rotten-tomatoes --limit 500
  actstore capture --model minilm-l6 --dataset rotten-tomatoes --pooling mean
  actstore cka RUN --plot cka.png           (RUN: a run key or its first 8+ characters)
"""


def connection_options(p: argparse.ArgumentParser, default) -> argparse.ArgumentParser:
    p.add_argument("--address", default=default, help="server address HOST:PORT (env ACTSTORE_ADDRESS)")
    p.add_argument("--store", default=default, help="the store: a directory, or s3://bucket/prefix (an S3-compatible "
                   "object store configured by AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
                   "AWS_REGION); the embedded mode's, or what serve owns (env ACTSTORE_STORE; with s3://, the "
                   "catalog lives in ACTSTORE_SERVER_DIR, default ./actstore-data)")
    p.add_argument("--token", default=default, help="access token if the server requires one (env ACTSTORE_TOKEN)")
    p.add_argument("--tls-ca", default=default, help="PEM CA certificate: connect over TLS, trusting the server's "
                   "certificate it signed (env ACTSTORE_TLS_CA)")
    p.add_argument("-v", "--verbose", action="store_true", default=default or False, help="log what happens")
    return p


def _list_of(kind: type):
    def parse(text: str) -> list:
        return [kind(part) for part in text.split(",") if part.strip()]

    parse.__name__ = f"comma-separated {kind.__name__} list"  # argparse names it in its usage errors
    return parse


int_list = _list_of(int)  # e.g. --seeds 0,1,2


def add_option(p: argparse.ArgumentParser, table: Table, name: str, *flags: str, extra_help: str = "",
               **kwargs) -> argparse.Action:
    """A flag for `table[name]`: its default, choices, type and help (with the default) come from
    the table, and its value is checked by the table (`option_type`). Flags default to
    --NAME-WITH-DASHES. A list option takes comma-separated values and defaults to None: the
    server's default, which the help shows."""
    option: Option = table[name]
    flags = flags or (f"--{name.replace('_', '-')}",)
    kwargs.setdefault("help", option.help_text(extra_help))
    if option.type is bool:
        return p.add_argument(*flags, action="store_true", default=option.default, **kwargs)
    if option.many:
        return p.add_argument(*flags, type=option_type(option), default=None, **kwargs)
    if option.choices is not None:  # argparse checks them, and its message lists them
        kwargs.setdefault("choices", list(option.choices))
        return p.add_argument(*flags, type=option.type, default=option.default, **kwargs)
    return p.add_argument(*flags, type=option_type(option), default=option.default, **kwargs)


def option_type(option: Option):
    """The argparse type of a flag for `option`: the text converted, then checked by the table. So a
    value the table refuses is a usage error with the table's message (a 0 among them, which the
    server refuses too), before any connection is made."""
    convert = _list_of(option.type) if option.many else option.type

    def parse(text: str):
        try:
            return option.check(convert(text))
        except InvalidArgument as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = getattr(convert, "__name__", option.type.__name__)  # argparse names it in its usage errors
    return parse


def server_path(text: str) -> str:
    """The argparse type of a path the server reads: a relative path that exists here is sent
    absolute (the server would resolve it against its own working directory); any other path is
    sent as written and resolved on the server."""
    path = Path(text)
    return str(path.absolute()) if not path.is_absolute() and path.exists() else text


SERVER_PATH_HELP = ("(a relative path that exists here is sent absolute; any other path is resolved on the server, "
                    "which must be able to read it)")


def size_text(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes} B"


MAX_LAYER = 100_000  # deeper than any model: a larger layer number is a typo, and a range to it is refused unbuilt
LAYERS_SYNTAX = "layer numbers (0 or more) as a list 0,3,5, a range 2-6, or a mix (0,2-4)"


def parse_layers(text: str) -> list[int]:
    """The argparse type of the --layers flags: '0,3,5' or '2-6' (or a mix) -> layer numbers. A
    wrong spelling, a reversed range or a layer beyond MAX_LAYER is a usage error naming the flag."""
    layers: list[int] = []
    for part in text.split(","):
        found = re.fullmatch(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?", part)
        if found is None:
            raise argparse.ArgumentTypeError(f"{text!r} is not a layer list: write {LAYERS_SYNTAX}")
        low, high = int(found[1]), int(found[2] or found[1])
        if high > MAX_LAYER:
            raise argparse.ArgumentTypeError(f"layer {high} in {text!r} is beyond any model (at most {MAX_LAYER})")
        if low > high:
            raise argparse.ArgumentTypeError(f"{part.strip()} is reversed: write {high}-{low}")
        layers.extend(range(low, high + 1))
    return layers


def layers_option(p: argparse.ArgumentParser, flag: str = "--layers", help: str = "") -> None:
    """A --layers flag: a list of layer numbers, or None (every layer) when it is not given."""
    p.add_argument(flag, type=parse_layers, metavar="LAYERS",
                   help=help or "e.g. 0,3,5 or 2-6 or a mix (default: all)")


def _server_answers(address: str) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            stub = health_pb2_grpc.HealthStub(channel)
            return stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5).status == 1
        except grpc.RpcError:
            return False


def server_address(args) -> str | None:
    """The server the command names (--address, ACTSTORE_ADDRESS), if any."""
    return args.address or os.environ.get("ACTSTORE_ADDRESS")


def connect(args):
    from actstore.client import Client, read_ca

    address = server_address(args)
    if address:
        return Client(address, token=args.token, root_certificates=read_ca(args.tls_ca) if args.tls_ca else None)
    if args.store is None and _server_answers(DEFAULT_ADDRESS):
        return Client(DEFAULT_ADDRESS, token=args.token)
    store = args.store or os.environ.get("ACTSTORE_STORE", "./actstore-data")
    print(f"(embedded server on store {store})", file=sys.stderr)
    return Client.embedded(store)


def print_table(rows: list[dict], columns: list[str]) -> None:
    if not rows:
        print("(none)")
        return
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for r in rows:
        print("  ".join(str(r[c]).ljust(widths[c]) for c in columns))


def output_options(p: argparse.ArgumentParser, plot: str | None = "write a PNG here") -> None:
    """--plot (unless plot is None), --json and --refresh, as every query command has them."""
    if plot is not None:
        p.add_argument("--plot", help=plot)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--refresh", action="store_true", help="recompute even if cached")


def measure_option_table(needs: str | None = None) -> Table:
    """Every option some measure (of `needs`) takes, each once: measures share alpha, k ..."""
    unique = {}
    for spec in measures.measures(needs):
        for option in spec.options:
            unique.setdefault(option.name, option)
    return Table("measure options", *unique.values())


def add_measure_options(p: argparse.ArgumentParser, needs: str | None = None) -> None:
    """A flag per option of the registered measures (of `needs`); a one-letter option is `-k`,
    the rest `--name-with-dashes`. The help names the measures that take it."""
    table = measure_option_table(needs)
    for name, option in table.items():
        takers = ", ".join(s.identifier for s in measures.measures(needs) if option in s.options)
        add_option(p, table, name, *((f"-{name}",) if len(name) == 1 else ()), extra_help=f"({takers})")


def given_options(args: argparse.Namespace, measure: str) -> dict:
    """The measure's options from the parsed flags. A flag of another measure's option set away
    from its default is a usage error (it would change nothing), as the generic RPC refuses it."""
    spec = measures.get(measure)
    takes = {option.name for option in spec.options}
    stray = [name for name, option in measure_option_table().items()
             if name not in takes and getattr(args, name, option.default) != option.default]
    if stray:
        flags = ", ".join(f"-{name}" if len(name) == 1 else f"--{name.replace('_', '-')}" for name in stray)
        raise InvalidArgument(f"{spec.identifier} does not take {flags} (it takes "
                              f"{', '.join(sorted(takes)) or 'no options'}: actstore measures lists them)")
    return {name: getattr(args, name) for name in takes}
