"""Honest hyperparameter tuning under silo-specific DP (thesis §1.7, appendix E).

- `distributions`: the random number of trials h (TNB(η, γ), Poisson(μ));
- `accounting`: RepeatAndSelect events for a tuned release, naive-grid composition, σ search;
- `private`: `TunedPersonalization`, MR-MTL/Ditto with λ (and lr) tuned per silo in training;
- `routes`: the other two routes — a public proxy (free) and the exponential mechanism;

The tuning path is one for every privacy unit: graph data's node-level events are in
`privacy.node_tuning`, its validation score in the pandemic domain (`pandemic.tuning`).

Submodules are imported where used (the planner imports `accounting` only).
"""
