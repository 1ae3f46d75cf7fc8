"""Where things are: the repository root (realhf's own constant), the tests directory and the
committed tiny-math assets. Tests that start `training/` or `scripts/` run them from REPO."""

import os

from realhf.experiments.config_loading import REPO_ROOT as REPO

TESTS_DIR = os.path.join(REPO, "tests")
TINY_MATH = os.path.join(REPO, "assets", "tiny-math")
