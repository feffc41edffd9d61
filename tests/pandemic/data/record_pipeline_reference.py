"""Record the pre-refactor pipeline's seeded results (reference for the engine).

Run once, at commit fdbbcdd (before the pandemic track moved onto the core engine), as
``python record_pipeline_reference.py tests/pandemic/data/pipeline_reference``; it wrote
pipeline_reference.npz (weights per config) and .json (config, σ, ε, steps), which
tests/pandemic/test_engine.py compares the engine against.  Kept for provenance: running
it now reproduces the same files through the engine."""
import json
import sys
import tempfile

import numpy as np

from silofl.pandemic import pipeline as P
from silofl.pandemic import read_dataset, synthesize

out = sys.argv[1]

work = tempfile.mkdtemp() + "/small"
synthesize(work, persons=4000, regions=4, seed=7)
data = read_dataset(work, with_target=True)
CONFIGS = {
 "mrmtl_declared": dict(rounds=2, batch_size=64, epsilon=8.0, noise="seeded", seed=3),
 "mrmtl_private_pre": dict(rounds=2, batch_size=64, epsilon=8.0, noise="seeded", seed=3,
                           preprocessing="private"),
 "central_nonprivate": dict(federated=False, rounds=1, batch_size=128, private=False, seed=1, noise="seeded"),
 "mrmtl_node_uncharged": dict(rounds=3, batch_size=100, epsilon=4.0, noise="seeded", seed=5,
                              adjacency="node", preprocessing="uncharged", local_epochs=0.5,
                              lam=0.3),
}
arrays, meta = {}, {}
for name, kw in CONFIGS.items():
    pm = P.train(data, P.PandemicConfig(**kw))
    arrays[name] = pm.weights
    meta[name] = {"config": kw, "regions": pm.regions,
                  "sigma": [p["noise_multiplier"] for p in pm.privacy],
                  "epsilon_spent": [p.get("epsilon_spent") for p in pm.privacy],
                  "steps": [p["steps"] for p in pm.privacy]}
np.savez(out + ".npz", **arrays)
json.dump(meta, open(out + ".json", "w"), indent=1)
print(json.dumps(meta, indent=1))
