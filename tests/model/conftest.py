"""Options of the model check: ``--profile short|long``, ``--seed N``, ``--steps N``.

Each also reads an environment variable (ICEBERG_SINK_MODEL_PROFILE, ICEBERG_SINK_MODEL_SEED,
ICEBERG_SINK_MODEL_STEPS); the command line wins. ICEBERG_SINK_MODEL_SKIP=kind,kind disables operation
kinds (see tests/model/harness.py OPERATIONS); by default every kind runs.
"""

from __future__ import annotations

import os

import pytest

# (seeds, steps per seed) of each profile.
PROFILES: dict[str, tuple[list[int], int]] = {
    "short": ([1, 2, 3], 12),
    "long": ([101, 102, 103, 104, 105, 106, 107, 108], 60),  # plus SIGKILLed subprocess drivers
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("model", "iceberg_sink randomized model check")
    group.addoption("--profile", choices=sorted(PROFILES), default=None, help="model check profile (default short)")
    group.addoption("--seed", type=int, default=None, help="run only this seed (reproduces a failure)")
    group.addoption("--steps", type=int, default=None, help="steps per seed (default: the profile's)")


def _option(config: pytest.Config, name: str, env: str) -> str | None:
    value = config.getoption(name, default=None)
    return str(value) if value is not None else os.environ.get(env)


def model_profile(config: pytest.Config) -> str:
    return _option(config, "--profile", "ICEBERG_SINK_MODEL_PROFILE") or "short"


def model_seeds(config: pytest.Config) -> tuple[list[int], int]:
    profile = model_profile(config)
    seeds, steps = PROFILES[profile]
    seed = _option(config, "--seed", "ICEBERG_SINK_MODEL_SEED")
    if seed is not None:
        seeds = [int(seed)]
    step_override = _option(config, "--steps", "ICEBERG_SINK_MODEL_STEPS")
    return seeds, int(step_override) if step_override is not None else steps


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "model_seed" in metafunc.fixturenames:
        seeds, steps = model_seeds(metafunc.config)
        metafunc.parametrize("model_seed", seeds)
        metafunc.parametrize("model_steps", [steps])
    if "model_job_seed" in metafunc.fixturenames:
        # A dedicated job's test (its steps also run at random in every seed): one seed in the short
        # profile (CI time), every seed in the long one or the one given.
        seeds, steps = model_seeds(metafunc.config)
        short = model_profile(metafunc.config) == "short"
        metafunc.parametrize("model_job_seed", seeds[:1] if short else seeds)
    if "model_long" in metafunc.fixturenames:
        profile = model_profile(metafunc.config)
        metafunc.parametrize("model_long", [profile == "long"], ids=[profile])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``model_long_only`` run in the long profile only (deselected, and reported as
    such, in the short one): dedicated runs of a job whose steps the short profile also draws at random."""
    if model_profile(config) == "long":
        return
    kept = [i for i in items if i.get_closest_marker("model_long_only") is None]
    dropped = [i for i in items if i.get_closest_marker("model_long_only") is not None]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
