"""The embedded code task's generator: seeded, held-out prompts never in train, one right function
per prompt among the families, reference bodies that pass their own hidden tests, and text the
tiny tokenizer spells exactly."""

import ast
import json

from realhf.plugins.tasks.code_task import (
    CODE_PREFIX,
    FAMILIES,
    N_EXAMPLES,
    N_TESTS,
    STRING_LETTERS,
    apply,
    generate_splits,
    to_rows,
    vocabulary,
)
from realhf.plugins.tasks.tiny_model import build_tokenizer
from scripts.make_code_task import main as make_code_task


def test_generation_is_deterministic_and_the_test_split_does_not_depend_on_train_size():
    a_train, a_test = generate_splits(300, 50, seed=3)
    b_train, b_test = generate_splits(300, 50, seed=3)
    assert a_train == b_train and a_test == b_test
    assert generate_splits(10, 50, seed=3)[1] == a_test
    assert generate_splits(300, 50, seed=4)[1] != a_test


def test_no_prompt_repeats_and_no_test_prompt_is_in_train():
    train, test = generate_splits(3000, 300, seed=1)
    prompts = [p.prompt for p in train + test]
    assert len(set(prompts)) == len(prompts)


def test_every_body_passes_its_hidden_tests_and_is_the_only_family_member_fitting_its_examples():
    train, _ = generate_splits(600, 0, seed=2)
    for p in train:
        assert len(p.examples) == N_EXAMPLES and len(p.tests) == N_TESTS
        shown = [ast.literal_eval(a) for a, _ in p.examples]
        hidden = [ast.literal_eval(a) for a, _ in p.tests]
        assert not any(h in shown for h in hidden)  # the tests are other inputs
        for arg, want in p.tests:
            assert apply(p.body, ast.literal_eval(arg)) == ast.literal_eval(want)
        family = next(f for f in FAMILIES if p.body in f.bodies and type(shown[0]).__name__ == f.kind)
        for other in family.bodies:
            if other != p.body:
                assert [apply(other, a) for a in shown] != [apply(p.body, a) for a in shown], (p.prompt, other)
    assert {p.body for p in train} >= {"x[::-1]", "sorted(x)", "x*2"}  # every family is drawn


def test_rows_carry_what_the_code_env_needs():
    (row,) = to_rows(generate_splits(1, 0, seed=1)[0], "train")
    assert set(row) == {"query_id", "prompt", "solutions", "task", "code_prefix", "entry_point", "tests"}
    assert row["prompt"].endswith("\n" + CODE_PREFIX) and row["code_prefix"] == CODE_PREFIX
    assert row["solutions"][0].startswith(" ") and row["task"] == "code"
    json.dumps(row)  # plain JSON


def test_the_tokenizer_spells_strings_one_letter_a_token_and_decodes_every_text():
    assert not set(STRING_LETTERS) & set("".join(vocabulary()))
    tok = build_tokenizer(vocabulary())
    train, _ = generate_splits(400, 0, seed=5)
    for p in train:
        for text in (p.prompt, " " + p.body):
            ids = tok.encode(text, add_special_tokens=False)
            assert tok.decode(ids) == text and tok.unk_token_id not in ids
    pieces = tok.tokenize("f('bcgk')='kgcb'")
    assert pieces[pieces.index("'") + 1 : pieces.index("'") + 5] == ["b", "c", "g", "k"]


def test_data_only_writes_the_splits_the_generator_gives(tmp_path):
    assert make_code_task(["--out", str(tmp_path), "--data-only", "--n-train", "40", "--n-test", "10"]) == 0
    train, test = generate_splits(40, 10, seed=1)
    for split, problems in (("train", train), ("test", test)):
        rows = [json.loads(line) for line in (tmp_path / "data" / f"{split}.jsonl").read_text().splitlines()]
        assert rows == to_rows(problems, split)
