"""Client method for the matrix-entropy family (Skean et al. 2025), token rows or words.

    c.entropy("dataset_entropy", pooled_run)                              # one value per layer
    c.entropy("prompt_entropy", token_run, align="words", word_pool="last")  # over each text's words
"""

from __future__ import annotations

from collections.abc import Sequence

from actstore._proto.actstore.v1 import actstore_pb2 as pb
from actstore.client.arguments import options
from actstore.client.results import LayerValues, QueryAnswer
from actstore.options import ENTROPY


class EntropyMixin:
    """`Client`'s entropy query (needs its `_query` stub)."""

    @options(ENTROPY)
    def entropy(self, metric: str, run: str, *, layers: Sequence[int] | None = None,
                alpha: float = ENTROPY.alpha.default, normalization: str = ENTROPY.normalization.default,
                clamp: bool = ENTROPY.clamp.default, convention: str = ENTROPY.convention.default,
                abs_cos: bool = ENTROPY.abs_cos.default, permutations: int = ENTROPY.permutations.default,
                seed: int = ENTROPY.seed.default, exp: bool = ENTROPY.exp.default,
                temperature: float = ENTROPY.temperature.default, preset: str = ENTROPY.preset.default,
                align: str = ENTROPY.align.default, word_pool: str = ENTROPY.word_pool.default,
                refresh: bool = False) -> LayerValues:
        """One value per layer of a matrix-entropy family metric (Skean et al. 2025): one of
        dataset_entropy, effective_rank (pooled runs), prompt_entropy, curvature (token-level runs),
        infonce, dime, lidar (pooled runs of an augmented dataset). preset="skean2025" reproduces the
        Layer by Layer reference code from a token-level run (docs/metrics.md, Reference presets).
        align="words" pools a token-level run's tokens to the words of each text first (word_pool:
        mean or last token of each word): dataset_entropy and effective_rank over all word vectors,
        prompt_entropy and curvature over each text's words, so models with different tokenizers
        give curves over the same units (docs/metrics.md, Cross-tokenizer alignment)."""
        request = pb.EntropyRequest(
            metric=pb.EntropyRequest.Metric.Value(metric.upper()), run=run, layers=list(layers or []), alpha=alpha,
            normalization=normalization, clamp=clamp, convention=convention, abs_cos=abs_cos,
            permutations=permutations, seed=seed, exp=exp, temperature=temperature, preset=preset, align=align,
            word_pool=word_pool, refresh=refresh)
        answer = QueryAnswer.from_proto(self._query.Entropy(request))
        return LayerValues(answer.arrays["values"], answer.provenance.options["layers"], answer.scalars,
                           answer.provenance, answer.notes)
