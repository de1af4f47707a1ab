"""The `actstore` command. Run `actstore --help`, or `actstore COMMAND --help`.

One module per command group; each has `add_commands(command)`, which adds its subcommands with
`command(name, func, help, description)`. Flags for metric options are built from
`actstore.options`, so their defaults and choices are the client's and the server's.

    admin     serve, token, demo, experiment
    upkeep    catalog (backup, restore, rebuild), gc
    catalog   register-model, register-dataset, models, datasets, runs, describe, delete, read
    jobs      capture, train, verify, jobs, watch, cancel
    imports   import
    compare   cka, cos, minibatch-cka, knn, cka-matrix, stitch
    measures  similarity (Procrustes, CCA, SVCCA, PWCCA, RSA, RBF CKA, CKNNA ... by identifier)
    diagnostics  outliers (and the --bootstrap / --null / feature flags of cka and cos)
    layers    entropy, residual-norm, lens, nc1
    probes    register-labels, label-sets, probe (which layer encodes a label; Layer by Layer)
    readers   sql
    progression  progression (a metric per layer over training steps)
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import actstore
from actstore.cli import (
    admin,
    catalog,
    compare,
    diagnostics,
    imports,
    jobs,
    layers,
    measures,
    probes,
    progression,
    readers,
    upkeep,
)
from actstore.cli.common import DEFAULT_ADDRESS, DESCRIPTION, connect, connection_options, parse_layers
from actstore.errors import ActStoreError

__all__ = ["DEFAULT_ADDRESS", "build_parser", "connect", "main", "parse_layers"]

GROUPS = (admin, catalog, jobs, imports, compare, diagnostics, measures, layers, probes, upkeep, readers, progression)


def build_parser() -> argparse.ArgumentParser:
    parser = connection_options(argparse.ArgumentParser(
        prog="actstore", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter), None)
    parser.add_argument("--version", action="version", version=f"actstore {actstore.__version__}",
                        help="print the installed actstore's version and exit")
    # the same options after the command name: `actstore serve --store DIR` works too
    common = connection_options(argparse.ArgumentParser(add_help=False), argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name, func, help_text, description=None):
        p = sub.add_parser(name, help=help_text, description=description or help_text, parents=[common],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(func=func)
        return p

    for group in GROUPS:
        group.add_commands(command)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        status = _command(argv)
        sys.stdout.flush()  # a reader that has gone shows here rather than at exit
        return status
    except BrokenPipeError:  # `actstore cka RUN | head -3`: stop quietly, as commands in a pipe do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python flushes stdout again at exit
        return 1


def _command(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except ActStoreError as exc:
        print(f"error ({exc.code}): {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
