"""Honest hyperparameter tuning under silo-specific DP (thesis §1.7, appendix E).

- `distributions`: the random number of trials h (TNB(η, γ), Poisson(μ));
- `accounting`: RepeatAndSelect events for a tuned release, naive-grid composition, σ search;
- `private`: `TunedPersonalization`, MR-MTL/Ditto with λ (and lr) tuned per silo in training;
- `routes`: the other two routes — a public proxy (free) and the exponential mechanism;
- `graph`: graph data (node-level unit): the node-level validation score and its
  sensitivity, and RepeatAndSelect over node-level trials (`pandemic.pipeline.train`).

Submodules are imported where used (the planner imports `accounting` only).
"""
