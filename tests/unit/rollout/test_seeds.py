"""Seeds derived from one request seed: stable, distinct per key, and spread over the whole
seed range, so vLLM's per-sample seeds (seed, seed + 1, ... for n samples) of two keys
rarely meet (added offsets met at once: seed 0's samples 1..255 were seed 1's 0..254)."""

from __future__ import annotations

from services.rollout.schemas import SamplingParams, derive_seed


def test_derived_seeds_are_stable_distinct_and_far_apart() -> None:
    seeds = [derive_seed(7, prompt) for prompt in range(200)]
    assert seeds == [derive_seed(7, prompt) for prompt in range(200)]  # reproducible
    assert len(set(seeds)) == len(seeds)
    assert all(0 <= s < 2**31 for s in seeds)
    ordered = sorted(seeds)
    assert min(b - a for a, b in zip(ordered, ordered[1:], strict=False)) > 256
    assert derive_seed(7, 1, 2) != derive_seed(7, 2, 1) != derive_seed(8, 1, 2)


def test_params_without_a_seed_stay_unseeded() -> None:
    assert SamplingParams().derived(3).seed is None
    seeded = SamplingParams(seed=5, temperature=0.7)
    assert seeded.derived(3) == seeded.model_copy(update={"seed": derive_seed(5, 3)})
