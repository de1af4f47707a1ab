"""`actstore experiment`: the central experiment of "Tracing Representation Progression".

Trains one model per method (standard, aligned, multi-exit, ce-reg) with the same recipe and
budget, for every seed asked, captures each on the recipe's held-out set, and asks the service for
the logit-lens accuracy per layer, COS to the last layer, the saturation distribution, the
epsilon-effective depth and the multi-exit sweep. Writes plots and a Markdown report that states,
from the numbers, whether each of the paper's claims reproduces over the seeds (`claims.RULE`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from actstore.client import Client
from actstore.experiment.claims import MethodResult
from actstore.experiment.writeup import write_report
from actstore.options import LENS
from actstore.training import METHODS

__all__ = ["MethodResult", "run_experiment", "write_report"]


def run_experiment(recipe: str, out: Path, *, smoke: bool = False, seeds: Sequence[int] = (0,),
                   steps: int | None = None, store: str | None = None, address: str | None = None,
                   epsilon: float = LENS.epsilon.default, beta: float | None = None) -> Path:
    """Train every method once per seed, query, and write `out/report.md`. `beta`: ce-reg's
    coefficient (None: the recipe's)."""
    from actstore.training import get_recipe

    seeds = list(dict.fromkeys(seeds))
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    spec = get_recipe(recipe, smoke=smoke)
    source = spec.eval_source()
    client = Client(address) if address else Client.embedded(store or "./actstore-data")
    results: dict[int, dict[str, MethodResult]] = {}
    timings: dict[str, float] = dict.fromkeys(METHODS, 0.0)
    with client:
        eval_name = f"{recipe}{'-smoke' if smoke else ''}-eval"
        client.register_dataset(builtin=source["name"], limit=source["limit"], seed=source["seed"],
                                split=source.get("split"), name=eval_name)
        pooling = "tokens" if spec.kind == "causal-lm" else "cls"
        for seed in seeds:
            results[seed] = {}
            for method in METHODS:
                t = time.perf_counter()
                model = client.train(recipe, method, seed=seed, steps=steps, smoke=smoke, progress=True,
                                     beta=beta if method == "ce-reg" else None)
                run = client.capture(model.digest, eval_name, pooling=pooling, max_len=spec.max_len or None,
                                     progress=True).run_key
                lens = client.lens(run, epsilon=epsilon)
                cos = client.cos(run, layers_b=[model.num_layers]).mean[:, 0] if pooling != "tokens" else \
                    np.full(model.num_layers + 1, np.nan)
                own = client.lens(run, epsilon=epsilon, heads="exits") if method == "multi-exit" else None
                results[seed][method] = MethodResult(method, model.digest, run, lens, cos, own)
                timings[method] += time.perf_counter() - t
                print(f"seed {seed} {method}: final accuracy {lens.accuracy[-1]:.4f}, "
                      f"effective depth {lens.effective_depth}")
    used_beta = spec.beta if beta is None else beta
    report = write_report(recipe, smoke, used_beta, epsilon, results, timings, out, time.perf_counter() - started)
    print(f"report written to {report}")
    return report
