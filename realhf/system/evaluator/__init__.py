"""The evaluator: periodic and final held-out evaluation, pass@k."""
