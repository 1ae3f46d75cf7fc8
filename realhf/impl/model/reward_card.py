"""What kind of reward model an HF directory holds, written beside its weights by training/main_rm.py.

    RewardCard(kind, beta, reference)   `realhf_reward.json` in the model's directory
    write_card(path, card) / read_card(path)

Two kinds (realhf.api.choices.REWARD_MODEL_KINDS):
    value_head   AutoModelForTokenClassification, one label: the score is its output at the
                 answer's last token
    implicit     AutoModelForCausalLM: the score is beta * Σ over the answer's tokens of
                 log π(token) - log π_reference(token), where the reference is the model it was
                 trained from (`reference`); the same Bradley–Terry loss trains it (an implicit
                 reward, Yuan et al. 2024, "Free Process Rewards without Process Labels"). It
                 checks each token with the model's own next-token knowledge, which a value head
                 at the last token has to learn from the pairs alone.

A directory without a card but with a token-classification config is a value-head model (written
before cards existed). The RL run reads the card to load the model and to check that its
reference is the run's.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

CARD_FILE = "realhf_reward.json"


@dataclass(frozen=True)
class RewardCard:
    kind: str  # "value_head" or "implicit"
    beta: float = 1.0  # implicit: the score's scale
    reference: str = ""  # implicit: the model directory the log-ratio is taken against


def write_card(path: Path, card: RewardCard) -> None:
    (Path(path) / CARD_FILE).write_text(json.dumps(asdict(card), indent=1) + "\n")


def read_card(path: str) -> Optional[RewardCard]:
    """The card of the model at `path`; None where there is neither a card nor a config.json that
    says what the model is. A malformed card is a ValueError naming the file."""
    where = Path(path) / CARD_FILE
    if where.is_file():
        try:
            raw = json.loads(where.read_text())
            return RewardCard(
                kind=str(raw["kind"]), beta=float(raw.get("beta", 1.0)), reference=str(raw.get("reference", ""))
            )
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{where}: not a reward model card ({type(e).__name__}: {e})") from None
    config = Path(path) / "config.json"
    if config.is_file():
        try:
            archs = json.loads(config.read_text()).get("architectures") or []
        except ValueError:
            return None
        if any(a.endswith("ForTokenClassification") for a in archs):
            return RewardCard(kind="value_head")
    return None
