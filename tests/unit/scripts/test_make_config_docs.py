"""docs/config.md is what the config tree generates (scripts/make_config_docs.py): a key added,
renamed or re-described in realhf/api/cli_args.py without regenerating the page fails here."""

import dataclasses

from realhf.api.cli_args import AsyncPPOConfig
from scripts import make_config_docs


def _leaf_keys(cfg, prefix=""):
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            yield from _leaf_keys(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}"


def test_the_config_page_is_up_to_date():
    page = make_config_docs.PAGE.read_text()
    assert page == make_config_docs.render(), "docs/config.md is out of date: run python -m scripts.make_config_docs"


def test_the_page_lists_every_key_of_the_config_tree():
    page = make_config_docs.render()
    missing = [k for k in _leaf_keys(AsyncPPOConfig()) if f"| `{k}` |" not in page]
    assert not missing, missing
