"""SGLang Model Gateway's ``cache_aware`` choice (``prorsa_emulated.smg.choose``), which the
emulated router follows, on hand-built cases."""

from __future__ import annotations

import pytest

from prorsa_emulated import smg


def test_balanced_loads_send_a_request_to_the_worker_holding_its_prefix():
    # Worker 2 holds 900 of a 1000-token prompt: 0.9 > 0.3.
    assert smg.choose([5, 3, 9], [100, 50, 400], match=2, matched=900, prompt=1000) == 2


def test_a_short_match_or_none_goes_to_the_smallest_tree_not_the_least_loaded():
    # 300 of 1000 is not more than 0.3 of the prompt: the smallest tree (worker 1), though
    # worker 0 is the least loaded.
    assert smg.choose([1, 3, 2], [500, 20, 80], match=2, matched=300, prompt=1000) == 1
    assert smg.choose([1, 3, 2], [500, 20, 80], match=None, matched=0, prompt=1000) == 1
    # Equal trees: the first.
    assert smg.choose([4, 3], [0, 0], match=None, matched=0, prompt=10) == 0


def test_imbalanced_loads_go_to_the_least_loaded_whatever_it_caches():
    # 100 - 20 = 80 > 64 requests and 100 > 1.5 x 20: imbalanced.
    assert smg.choose([100, 20, 50], [0, 900, 10], match=0, matched=1000, prompt=1000) == 1
    # 80 - 20 = 60 is within the absolute threshold: balanced, the match wins.
    assert smg.choose([80, 20, 50], [0, 900, 10], match=0, matched=1000, prompt=1000) == 0


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        smg.choose([], [], match=None, matched=0, prompt=1)
    with pytest.raises(ValueError):
        smg.choose([1, 2], [0], match=None, matched=0, prompt=1)
