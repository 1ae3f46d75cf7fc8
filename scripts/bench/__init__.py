"""realhf's benchmark suite (issue 5): `python -m scripts.bench all|<name> [--short] [--out-dir docs]`.

One module per benchmark (e2e, generation, generation_sizes, stream, weight_update, manager, scaling, trainer,
engine, launchers, time_to_accuracy, data_parallel, vs_trl, levers, vs_trl_smollm2, long_task, vs_trl_long, timeline, vllm_engine, reward_isolation); each runs alone as `python -m scripts.bench.<name> [--short]`, prints its
tables, and ends with exactly one JSON line `{"bench": "<name>", ...}`. Benchmarks measure and never
assert: on a shared machine trust the ratios measured side by side in one run, not the absolute
numbers.
"""

BENCHMARKS = (
    "e2e",
    "generation",
    "generation_sizes",
    "stream",
    "weight_update",
    "manager",
    "scaling",
    "trainer",
    "engine",
    "launchers",
    "time_to_accuracy",
    "data_parallel",
    "vs_trl",
    "levers",
    "vs_trl_smollm2",
    "long_task",
    "vs_trl_long",
    "timeline",
    "vllm_engine",
    "reward_isolation",
)
