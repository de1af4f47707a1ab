"""Keeping a store healthy: the catalog's backups, restore and rebuild, and garbage collection."""

from __future__ import annotations

from pathlib import Path

from actstore.cli.common import add_option, connect, print_table, size_text
from actstore.options import GC


def _offline_settings(args):
    from actstore.config import Settings

    overrides = {k: v for k, v in {"store": args.store, "catalog": args.catalog, "server_dir": args.server_dir}.items()
                 if v is not None}
    return Settings(**overrides)


def _rebuild(args) -> int:
    from actstore.errors import AlreadyExists
    from actstore.store.handle import StoreHandle
    from actstore.store.upkeep.rebuild import rebuild_catalog_file

    settings = _offline_settings(args)
    path = settings.catalog_path
    if path.exists():
        raise AlreadyExists(f"the catalog {path} exists: move it aside first (rebuild writes a fresh one), or give "
                            "another --catalog")
    store = StoreHandle.from_settings(settings)
    store.check()
    report = rebuild_catalog_file(store, path)
    print(f"rebuilt {path} from {settings.store_root}: {report.models} models, {report.datasets} datasets, "
          f"{report.label_sets} label sets, {report.runs} runs ({report.committed_runs} committed), "
          f"{report.chunk_rows} chunk rows")
    if report.wal_moved is not None:
        print(f"  moved aside: the write-ahead log the lost catalog left beside it ({path.name}.wal, its last "
              f"transactions; DuckDB would refuse the new file with it) is now {report.wal_moved}: to open the "
              f"old catalog, put it beside that file as <that file's name>.wal")
    for line in report.skipped:
        print(f"  not recovered: {line}")
    for line in report.incomplete:
        print(f"  not committed: {line}")
    print("  never kept in the store, so not recovered: " + "; ".join(report.not_recoverable))
    return 0


def _restore(args) -> int:
    from actstore.store.catalog.backups import restore

    path = _offline_settings(args).catalog_path
    backup, aside = restore(path, Path(args.backup).expanduser().resolve() if args.backup else None)
    print(f"restored {path} from {backup}")
    if aside is not None:
        print(f"  the file it replaced is kept at {aside}")
    print("  runs captured after the backup are in the store but not in this catalog: `actstore gc` lists them, "
          "and `actstore catalog rebuild` into a new --catalog recovers every run")
    return 0


def _backup(args) -> int:
    with connect(args) as client:
        made = client.backup_catalog()
    print(f"backed the catalog up to {made.path} ({made.bytes} bytes); {len(made.kept)} backups kept")
    return 0


def cmd_catalog(args) -> int:
    if args.backup and args.action != "restore":
        raise SystemExit(f"actstore catalog {args.action} takes no BACKUP argument")
    return {"rebuild": _rebuild, "restore": _restore, "backup": _backup}[args.action](args)


def cmd_gc(args) -> int:
    with connect(args) as client:
        report = client.collect_garbage(older_than=args.older_than, max_bytes=args.max_bytes, apply=args.apply)
    print_table([{"kind": g.kind, "name": g.name[:16], "size": size_text(g.bytes), "why": g.reason}
                 for g in report.items], ["kind", "name", "size", "why"])
    if report.applied:
        print(f"removed {len(report.items)} items, {size_text(report.total_bytes)}")
    else:
        print(f"would remove {len(report.items)} items, {size_text(report.total_bytes)} "
              "(a dry run: add --apply to delete)")
    for line in report.kept:
        print(f"  kept: {line}")
    return 0


def add_commands(command) -> None:
    p = command("catalog", cmd_catalog, "back up, restore or rebuild the catalog",
                "backup    the server makes a consistent copy of its catalog now, in backups/ beside it (admin;\n"
                "          it also does so every ACTSTORE_CATALOG_BACKUP_SECONDS and when it stops)\n"
                "restore   put a backup (default: the latest) in the catalog's place; the current file is moved\n"
                "          aside, never deleted. Offline: refused while a server holds the catalog\n"
                "rebuild   recreate a lost catalog from the store alone (models, datasets, runs, chunk rows,\n"
                "          commit markers) into a fresh file; offline, never overwrites a catalog")
    p.add_argument("action", choices=["backup", "restore", "rebuild"])
    p.add_argument("backup", nargs="?", help="restore: the backup file (default: the newest in backups/)")
    p.add_argument("--catalog", help="restore, rebuild: the catalog file (default: the server's, see ACTSTORE_CATALOG)")
    p.add_argument("--server-dir", help="with an s3:// store: the server's own directory (ACTSTORE_SERVER_DIR)")

    p = command("gc", cmd_gc, "list (or --apply: delete) what the store no longer needs (admin)",
                "Cached results older than --older-than or beyond --max-bytes (oldest first), partials of\n"
                "finished, failed or cancelled matrix jobs and of jobs whose runs were deleted, run folders\n"
                "without a catalog row, and failed runs older than --older-than. Never a committed run's\n"
                "arrays, nor the partials of a job that is running or will resume. A dry run by default.")
    add_option(p, GC, "older_than")
    add_option(p, GC, "max_bytes")
    add_option(p, GC, "apply")
