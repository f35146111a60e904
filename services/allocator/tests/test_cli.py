"""`prorsa allocator solve` as a user types it: the §4.2 answer, and bad numbers named by
their option (a zero --kv-capacity was reported as the core's decode_kv_tokens)."""

import json

import pytest
from typer.testing import CliRunner

from prorsa_allocator.cli import allocator_app

BASE = ["solve", "--prefill-tokens", "100000", "--decode-kv-tokens", "1000", "--gpus", "16"]


def test_solve_prints_the_allocation():
    res = CliRunner().invoke(allocator_app, BASE)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    # 100k tokens over 10 s at 40k tokens/s per instance: 0.25 prefill instances of demand.
    assert (out["n_prefill"], out["n_decode"], out["prefill_demand"]) == (1, 1, 0.25)


@pytest.mark.parametrize("opt,value", [("--kv-capacity", "0"), ("--theta", "nan"), ("--horizon", "-1"),
                                       ("--prefill-tokens", "-5"), ("--gpus", "99999999999")])
def test_bad_numbers_are_named_by_their_option(opt, value):
    args = list(BASE)
    if opt in args:
        args[args.index(opt) + 1] = value
    else:
        args += [opt, value]
    res = CliRunner().invoke(allocator_app, args)
    assert res.exit_code == 2 and f"Invalid value for '{opt}'" in res.output, res.output
