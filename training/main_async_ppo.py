"""Asynchronous PPO on the configured task (math prompts by default): `python training/main_async_ppo.py [key=value ...]`, the same
run as the console command `realhf-train [key=value ...]`. The command lives in the package
(realhf/apps/train.py, which says what a run does) so that it runs from any directory; this
file keeps the documented path working. `--help` lists every field.
"""

from realhf.apps.train import (  # noqa: F401 - tests and tools reach the run's parts through this file
    accuracy_curve,
    claim_trial,
    cli,
    evaluate,
    evaluation_line,
    prune_run_dir,
    reward_curve,
    run,
)

if __name__ == "__main__":
    cli("python training/main_async_ppo.py")
