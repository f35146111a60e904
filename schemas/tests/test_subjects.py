from __future__ import annotations

import pytest

from prorsa_schemas import DEFAULT, EVENT_TYPES, Namespace, category


def test_every_type_has_a_subject_under_the_stream() -> None:
    for kind in EVENT_TYPES:
        subj = DEFAULT.subject_for_type(kind)
        assert subj.startswith("prorsa." + category(kind) + ".")
        assert subj.endswith(kind)


def test_categories() -> None:
    assert DEFAULT.commands() == "prorsa.control.engine.command"
    assert DEFAULT.rollout_all() == "prorsa.rollout.>"
    assert DEFAULT.subject_for_type("engine.stats") == "prorsa.engine.engine.stats"
    with pytest.raises(ValueError):
        category("nope")


@pytest.mark.parametrize("prefix", ["", "a b", "a.>", "*", "a..b"])
def test_bad_prefix_rejected(prefix: str) -> None:
    with pytest.raises(ValueError):
        Namespace(prefix=prefix)


def test_durable_names() -> None:
    assert DEFAULT.durable("tracker") == "prorsa-tracker"
    with pytest.raises(ValueError):
        DEFAULT.durable("a.b")
