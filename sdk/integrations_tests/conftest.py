"""Fixtures of the integration tests: the SDK tests' tracker and emulated PD cluster (one
prefill and one decode emulated engine behind sglang-router 0.3.2 in PD mode), reused
from sdk/tests/conftest.py; verl's config and a tiny local model (verl_setup.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

HERE = Path(__file__).resolve().parent


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


_fixtures = _load("prorsa_sdk_test_fixtures", HERE.parent / "tests" / "conftest.py")
verl_setup = _load("prorsa_verl_setup", HERE / "verl_setup.py")
tracker = _fixtures.tracker
emulated_pd = _fixtures.emulated_pd
TrackerHandle = _fixtures.TrackerHandle


_examples = _load("prorsa_sdk_test_examples", HERE.parent / "tests" / "test_examples.py")


@pytest.fixture(scope="session")
def verl_case(tmp_path_factory) -> SimpleNamespace:
    """verl's trainer config (its own files) for a tool-calling rollout on the tiny model:
    ``turns`` model answers per trajectory (all but the last call the tool), ``batch``
    prompts of ``n`` samples; with the SDK tests' ``Recorder`` (an emitter that keeps the
    id of each event it published) and ``check`` (the tracker holds exactly those events,
    every trajectory is done, no anomaly)."""
    root = tmp_path_factory.mktemp("verl")
    model = verl_setup.write_model(root)
    turns, batch, n = 3, 3, 2
    config = verl_setup.compose_config(root, model, turns=turns, response_length=256, batch=batch, n=n)
    return SimpleNamespace(config=config, turns=turns, batch=batch, n=n, Recorder=_examples.Recorder,
                           check=_examples._check)
