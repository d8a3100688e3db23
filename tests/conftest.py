"""Shared fixtures and the suite's tiers.

- Devices: the CPU reference and WebGPU. Under CI=true the WebGPU tests must run: a missing adapter
  fails them loudly. Elsewhere they skip with the reason. Tests accept a software adapter
  (lavapipe) here, unlike Device.default().
- Tiers: a test that needs torch or transformers (the parity checks against Hugging Face) is
  marked `hf` (`@pytest.mark.hf`; a module of them: `pytestmark = pytest.mark.hf`), so that
  `pytest -m "not hf"` is the core tier, which needs neither (its checkpoints are written with
  numpy and safetensors, gpt2_fixtures.py), and `pytest -m hf` the parity tier; CI runs both.
  WEBTENSOR_TEST_NO_HF=1 makes torch and transformers unimportable and fails an unmarked test that
  wants them: `WEBTENSOR_TEST_NO_HF=1 pytest -m "not hf"` proves the core tier needs neither.
- Hypothesis: under CI=true the `ci` profile (derandomized: the same examples every run, no example
  database); elsewhere `dev` (fresh random examples, the database in .hypothesis/ replays failures).
  `--hypothesis-profile thorough` runs THOROUGH_FACTOR (20) times each test's examples, fresh ones:
  the hunt for the inputs a new seed can hit (run it a suite at a time, it is long).
- Tolerances: a parity test compares with `tolerance.assert_close(got, want, scale, rtol=...)`, never
  with a bare relative error (test_tolerance.py checks the suite for it): results that can be near
  zero get an absolute floor scaled by the inputs (tolerance.py derives it).
- `--quick`: the everyday tier (<= 5 minutes on 2 cores) leaves out the tests marked `slow`, `browser`
  or `hf` and the shader-checked kernel runs (below), and says so in its last line; plain `pytest`
  (the README's command, CI's) runs everything.

Shader runtime checks: the WebGPU device compiles webtensor's kernels without the shader
compiler's bounds checks and loop bounding (the product default). The kernel parity suites
(BOTH_WAYS) run twice, once so and once with the checks (`Device.wgpu(shader_checks=True)`): a
kernel whose result depended on a clamped out-of-bounds index would differ between the two. The
checked run is a regression run, so it keeps a few derandomized hypothesis examples (CHECKED_EXAMPLES).
`--shader-checks off|on|both` (default both) picks which of the two those suites run.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import settings

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # silences the Vulkan loader's complaint

import webtensor as wt  # noqa: E402

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# A suite started in the background by a shell (`pytest &`) runs with SIGINT ignored, and every process a test starts
# would inherit that (an ignored signal stays ignored across exec): the tests that send Ctrl-C to a chat, a server or
# the page's server would wait for an exit that never comes. Take SIGINT as a foreground run does (children start
# with the default action: a handled signal is reset at exec).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev")
settings.register_profile("thorough", derandomize=False, print_blob=True)  # (examples: THOROUGH_FACTOR)
THOROUGH_FACTOR = 20
settings.load_profile("ci" if IN_CI else "dev")  # (before the test modules: their @settings inherit it)

HF_MODULES = ("torch", "transformers")
NO_HF = os.environ.get("WEBTENSOR_TEST_NO_HF", "") == "1"
if NO_HF:
    for _name in HF_MODULES:
        sys.modules[_name] = None  # type: ignore[assignment]  # `import torch` raises ImportError


def _wants_hf(text: str) -> bool:
    return any(f"'{m}'" in text or f"{m} " in text for m in HF_MODULES)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> object:
    """With WEBTENSOR_TEST_NO_HF=1, a test module that skips for want of torch or transformers
    fails unless it is marked `hf` (`pytestmark = pytest.mark.hf`)."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    path = getattr(collector, "path", None)
    if NO_HF and report.outcome == "skipped" and path is not None and path.suffix == ".py":
        if _wants_hf(str(report.longrepr)) and "pytestmark = pytest.mark.hf" not in path.read_text():
            report.outcome = "failed"
            report.longrepr = f"{path} needs torch or transformers but is not marked hf: {report.longrepr}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """With WEBTENSOR_TEST_NO_HF=1, a test not marked `hf` that skips or fails for want of torch or
    transformers fails, naming the mark it lacks."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if NO_HF and report.outcome != "passed" and item.get_closest_marker("hf") is None:
        text = str(report.longrepr)
        if _wants_hf(text):
            report.outcome = "failed"
            report.longrepr = f"{item.nodeid} needs torch or transformers but is not marked hf: {text[:300]}"


BOTH_WAYS = {"test_ops_parity", "test_kv_ops", "test_matmul_engine", "test_quant_engine", "test_q8_kernels",
             "test_gemv_stack", "test_quant_dot4", "test_moe_ops"}
CHECKED_EXAMPLES = 3  # hypothesis examples a test keeps in the checked run (derandomized)
GPU_FIXTURES = {"gpu", "gpu_small", "device"}


QUICK_LEAVES_OUT = ("slow", "browser", "hf")  # the marks `--quick` leaves out


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--shader-checks", choices=("off", "on", "both"), default="both",
                     help="run the kernel parity suites without the shader runtime checks (off), with them (on) "
                          "or both ways (default)")
    parser.addoption("--quick", action="store_true",
                     help=f"the everyday tier: leave out the tests marked {', '.join(QUICK_LEAVES_OUT)} (the "
                          "shader-checked kernel runs are `slow`); plain pytest runs everything")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    if module not in BOTH_WAYS or not GPU_FIXTURES & set(metafunc.fixturenames):
        return
    mode = metafunc.config.getoption("--shader-checks")
    ways = {"off": [False], "on": [True], "both": [False, True]}[mode]
    metafunc.parametrize("shader_checks", ways, ids=["trusted" if w is False else "checked" for w in ways],
                         indirect=True, scope="session")


def _checked(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    return callspec is not None and callspec.params.get("shader_checks") is True


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The examples each hypothesis test runs, and the quick tier's selection.

    Items of the checked run are marked `slow` and keep CHECKED_EXAMPLES derandomized examples; under the
    `thorough` profile every other hypothesis test runs THOROUGH_FACTOR times its examples. Hypothesis
    reads a test's settings from `_hypothesis_internal_use_settings` when it runs, so each such item gets
    its own wrapper with the new settings (the others keep the original function and settings).
    With --quick the items marked QUICK_LEAVES_OUT are deselected. (tryfirst: before `-m` selects.)"""
    thorough = settings.get_current_profile_name() == "thorough"
    for item in items:
        if _checked(item):
            item.add_marker(pytest.mark.slow)
        fn = getattr(item, "obj", None)
        old = getattr(fn, "_hypothesis_internal_use_settings", None)
        if old is None:
            continue
        if _checked(item):
            new = settings(old, max_examples=min(old.max_examples, CHECKED_EXAMPLES), derandomize=True,
                           database=None)
        elif thorough:
            new = settings(old, max_examples=old.max_examples * THOROUGH_FACTOR)
        else:
            continue
        item.obj = _with_settings(fn, new)
    if not config.getoption("--quick"):
        return
    kept, left = [], []
    for item in items:
        out = any(item.get_closest_marker(m) is not None for m in QUICK_LEAVES_OUT)
        (left if out else kept).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept
    config.stash[_QUICK_LEFT] = left


_QUICK_LEFT = pytest.StashKey[list[pytest.Item]]()


def pytest_unconfigure(config: pytest.Config) -> None:
    """A quick run's last line (after pytest's counts): what it left out and how to run it."""
    left = config.stash.get(_QUICK_LEFT, None)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if left is None or reporter is None:
        return
    counts = {m: sum(1 for i in left if i.get_closest_marker(m) is not None) for m in QUICK_LEAVES_OUT}
    what = ", ".join(f"{n} {m}" for m, n in counts.items() if n)
    reporter.write_line(
        f"quick tier: left out {len(left)} tests ({what or 'none'}; a test may carry two marks). "
        f"Everything (CI's run): `python -m pytest -q`; only what was left out: "
        f"`python -m pytest -q -m \"{' or '.join(QUICK_LEAVES_OUT)}\"`")


def _with_settings(fn: Any, reduced: Any) -> Any:
    import functools

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        saved = fn._hypothesis_internal_use_settings
        fn._hypothesis_internal_use_settings = reduced
        try:
            return fn(*args, **kwargs)
        finally:
            fn._hypothesis_internal_use_settings = saved

    return run


@pytest.fixture(scope="session")
def shader_checks(request: pytest.FixtureRequest) -> bool:
    """Whether the WebGPU fixtures compile kernels with the shader runtime checks (see the module
    docstring); False (the product default) outside the BOTH_WAYS suites."""
    return bool(getattr(request, "param", False))


def _wgpu(**kw) -> wt.Device:
    try:
        return wt.Device.wgpu(**kw)
    except wt.NoAdapterError as e:
        if IN_CI:
            pytest.fail(f"CI=true but no WebGPU adapter was found: {e}")
        pytest.skip(f"no WebGPU adapter: {e}")


@pytest.fixture(scope="session")
def cpu() -> wt.Device:
    return wt.Device.cpu()


@pytest.fixture(scope="session")
def gpu(shader_checks: bool) -> wt.Device:
    dev = _wgpu(shader_checks=shader_checks)
    assert dev.ctx.shader_checks is shader_checks, dev.describe()
    return dev


@pytest.fixture(scope="session")
def gpu_small(shader_checks: bool) -> wt.Device:
    """A WebGPU device whose binding limit is 64 KiB, to exercise row-chunking."""
    return _wgpu(max_binding_bytes=64 * 1024, shader_checks=shader_checks)


@pytest.fixture(params=["cpu", "wgpu"])
def device(request, shader_checks: bool) -> wt.Device:
    return wt.Device.cpu() if request.param == "cpu" else _wgpu(shader_checks=shader_checks)


def set_policy(monkeypatch: pytest.MonkeyPatch, *devices: wt.Device, **changes: Any) -> None:
    """Override fields of each WebGPU device's kernel policy (`Device.kernel_policy`) for the test:
    how tests force a kernel variant (gpu_style=True: the GPU kernels on lavapipe)."""
    for dev in devices:
        if dev.kind == "wgpu":
            monkeypatch.setattr(dev.ctx, "policy", dev.ctx.policy.replace(**changes))


@pytest.fixture(scope="session")
def api_server() -> Any:
    """The serving tests' shared server: `webtensor serve` on the CPU device with the shipped model
    and the default (batched) engine, 32 slots, one process for the whole session (a module that
    needs a differently configured server starts its own). (Here, not in tests/serve/conftest.py:
    a second conftest module would shadow this one for the tests' `from conftest import ...`.)"""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "serve"))
    from serve_helpers import Server

    s = Server.cli("--device", "cpu", "--max-batch", "32")
    yield s
    s.stop()


def rel_err(got, want) -> float:
    """Norm-wise relative error ||got - want|| / ||want|| (0 when both are 0)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    denom = np.linalg.norm(want)
    diff = np.linalg.norm(got - want)
    return float(diff / denom) if denom > 0 else float(diff)
