"""The learning-rate schedule."""

import pytest

from realhf.impl.model.optim import lr_factor


def test_lr_schedule_warms_up_linearly_then_follows_the_cosine_to_the_floor():
    f = lr_factor("cosine", total_steps=110, warmup_proportion=10 / 110, min_lr_ratio=0.1)
    assert [round(f(s), 6) for s in (0, 4, 9)] == [0.1, 0.5, 1.0]
    assert f(10) == pytest.approx(1.0)
    assert f(60) == pytest.approx(0.1 + 0.9 * 0.5)  # half way through the decay
    assert f(110) == pytest.approx(0.1) and f(500) == pytest.approx(0.1)
    assert lr_factor("constant", 0, 0.5)(1000) == 1.0
    with pytest.raises(ValueError, match="cosine.*total_train_steps"):
        lr_factor("cosine", 0, 0.0)
