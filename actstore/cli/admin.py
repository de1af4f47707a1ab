"""Running and administering a store: serve, token, and the end-to-end demo and experiment."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

from actstore.cli.common import add_option, connect, int_list, option_type, print_table, server_address
from actstore.options import DATASETS, LENS, SERVE, TRAIN

ROLES = ("reader", "writer", "admin")  # actstore.server.auth.ROLES, without importing the server


def cmd_serve(args) -> int:
    from actstore.config import Settings
    from actstore.server.app import start_server

    overrides = {k: v for k, v in {"host": args.host, "port": args.port, "store": args.store,
                                   "ray_address": args.ray_address, "metric_device": args.metric_device,
                                   "read_cache": args.read_cache}.items() if v is not None}
    if args.auth:
        overrides["auth"] = True
    if args.warm_model:
        overrides["warm_models"] = args.warm_model
    overrides.update({k: Path(v) for k, v in {"tls_cert": args.tls_cert, "tls_key": args.tls_key}.items() if v})
    server = start_server(Settings(**overrides))
    # the handler before the line that says the server is up: a SIGTERM sent on seeing that line
    # stops it cleanly (the catalog checkpointed), never kills it mid-way
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"actstore serving on {server.address} (store {server.service.settings.store_root}); Ctrl-C stops",
          flush=True)
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    server.stop()
    return 0


def cmd_token(args) -> int:
    from actstore.errors import InvalidArgument

    if args.action != "list" and not args.name:
        raise InvalidArgument(f"`actstore token {args.action}` needs --name")
    if server_address(args) and not args.store:  # a running server: an admin's token does it there
        with connect(args) as client:
            return _token_action(args, client.create_token, client.tokens, client.revoke_token)
    from actstore.config import Settings
    from actstore.server.auth import create_token
    from actstore.store.catalog import Catalog

    settings = Settings(**({"store": args.store} if args.store else {}))
    catalog = Catalog(settings.catalog_path)
    try:
        return _token_action(args, lambda name, role: create_token(catalog, name, role), catalog.principals.all,
                             catalog.principals.revoke)
    finally:
        catalog.close()


def _token_action(args, create, listing, revoke) -> int:
    if args.action == "create":
        token = create(args.name, args.role)
        print(f"token for {args.name} ({args.role}), shown once:\n{token}")
    elif args.action == "list":
        print_table([{"name": name, "role": role} for name, role in listing()], ["name", "role"])
    else:
        revoke(args.name)
        print(f"revoked {args.name}")
    return 0


def cmd_experiment(args) -> int:
    from actstore.experiment import run_experiment

    run_experiment(args.recipe, Path(args.out or f"actstore-experiment-{args.recipe}"), smoke=args.smoke,
                   seeds=args.seeds, steps=args.steps, store=args.store, address=args.address, epsilon=args.epsilon,
                   beta=args.beta)
    return 0


def cmd_demo(args) -> int:
    from actstore.demo import run_demo

    run_demo(out=Path(args.out), store=args.store, n=args.n, address=args.address)
    return 0


def add_commands(command) -> None:
    p = command("serve", cmd_serve, "run the gRPC server (Ray + store + catalog owner)",
                "Serve the store on HOST:PORT. Joins RAY_ADDRESS / --ray-address, else starts a local Ray.\n"
                "Every option is also an ACTSTORE_ environment variable (ACTSTORE_PORT, ...).")
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 50151; 0 picks one)")
    p.add_argument("--ray-address", help="Ray cluster to join (default: RAY_ADDRESS, else a local one)")
    p.add_argument("--auth", action="store_true", help="require tokens (make them with `actstore token create`)")
    p.add_argument("--warm-model", action="append", metavar="MODEL",
                   help="start this registered model's capture replicas with the server and keep them warm "
                        "(repeat for more; env ACTSTORE_WARM_MODELS as a JSON list)")
    p.add_argument("--read-cache", metavar="DIR",
                   help="with an s3:// store: each node keeps the shards it reads in its local DIR (its NVMe), "
                        "so repeated metric jobs read them from disk; at most ACTSTORE_READ_CACHE_GB (50) GB a "
                        "node (env ACTSTORE_READ_CACHE)")
    p.add_argument("--tls-cert", help="PEM certificate chain: serve over TLS (env ACTSTORE_TLS_CERT)")
    p.add_argument("--tls-key", help="PEM private key of --tls-cert (env ACTSTORE_TLS_KEY)")
    add_option(p, SERVE, "metric_device")

    p = command("token", cmd_token, "create, list or revoke access tokens",
                "With --address (or ACTSTORE_ADDRESS) and an admin's --token: on that running server, where a\n"
                "revoked token is refused on its next call. Otherwise (or with --store) on the store's catalog\n"
                "directly, offline: run it while no server owns the store.")
    p.add_argument("action", choices=["create", "list", "revoke"])
    p.add_argument("--name", help="the principal the token stands for (create, revoke)")
    p.add_argument("--role", default="reader", choices=list(ROLES), help="what the token may do (default reader)")

    p = command("demo", cmd_demo, "the main job: capture MiniLM-L6 and SmolLM2, compare layers, write a report",
                "Embedded by default. Captures MiniLM-L6 and SmolLM2-135M on Rotten Tomatoes reviews, computes\n"
                "within-model CKA and COS matrices and the cross-model CKA matrix, and writes heatmaps and a\n"
                "Markdown report to --out.")
    p.add_argument("--out", default="actstore-demo", help="output folder (default ./actstore-demo)")
    p.add_argument("--n", type=option_type(DATASETS.limit), default=300, help="number of reviews (default 300)")

    p = command("experiment", cmd_experiment, "aligned vs standard training: train, capture, lens, report",
                "Trains standard, aligned, multi-exit and ce-reg models with one recipe and budget for every\n"
                "seed of --seeds, captures the held-out set, and writes accuracy / COS / saturation plots,\n"
                "effective depths, the multi-exit table and each of the paper's claims with its mean and\n"
                "spread over the seeds. A claim reproduces only if it holds on every seed; it does not if it\n"
                "fails on any seed; otherwise it is not testable.")
    p.add_argument("--recipe", default="vit-fmnist", choices=list(TRAIN.recipe.choices),
                   help="the training recipe (default vit-fmnist)")
    p.add_argument("--out", help="output folder (default ./actstore-experiment-RECIPE)")
    add_option(p, TRAIN, "smoke", help="tiny sizes (seconds), for tests")
    p.add_argument("--seeds", type=int_list, default=[0], help="training seeds, e.g. 0,1,2 (default 0)")
    add_option(p, TRAIN, "steps", extra_help="per method")
    add_option(p, TRAIN, "beta")
    add_option(p, LENS, "epsilon")
