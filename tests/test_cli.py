"""The command line as a user meets it: real `python -m webtensor` processes given bad arguments, bad
environment values, undecodable stdin, a closed stdout and Ctrl-C answer with one stderr line, the
documented exit code and nothing on stdout; and the API's validation of generation inputs (the same
rules and messages as the CLI), with hypothesis drawing the inputs."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import webtensor as wt
from webtensor import validate as v
from webtensor.cli import main
from webtensor.models.gpt2 import GPT2

SRC = Path(__file__).resolve().parents[1] / "src"
USAGE, RUNTIME, INTERRUPTED, CLOSED_PIPE = 2, 1, 130, 141


def _env(**extra: str) -> dict[str, str]:
    env = {k: val for k, val in os.environ.items() if not k.startswith("WEBTENSOR_")}
    env.update(XDG_RUNTIME_DIR="/tmp", PYTHONPATH=str(SRC), **extra)
    return env


def webtensor(*args: str | bytes, stdin: bytes = b"", **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "webtensor", *args], input=stdin, env=_env(**env),
                          capture_output=True, timeout=60)


def assert_one_line(r: subprocess.CompletedProcess, code: int, pattern: str) -> None:
    """Exit `code`, nothing on stdout, and stderr exactly one line matching `pattern`."""
    err = r.stderr.decode()
    assert r.returncode == code, (r.returncode, err)
    assert r.stdout == b"", r.stdout[:200]
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert re.match(pattern, lines[0]), lines[0]


GEN = ("generate", "hello", "--device", "cpu")
BAD_ARGS = [
    # (id, argv, exit code, the one stderr line)
    ("n-zero", [*GEN, "-n", "0"], USAGE, r"webtensor: error: argument -n/--max-new-tokens: max_new_tokens must "
     r"be an integer >= 1, got 0"),
    ("n-word", [*GEN, "-n", "many"], USAGE, r"webtensor: error: .*max_new_tokens .* got 'many'"),
    ("temperature-negative", [*GEN, "-t", "-1"], USAGE, r"webtensor: error: argument --temperature/-t: "
     r"temperature must be a finite number >= 0 \(0 = greedy\), got -1\.0"),
    ("temperature-nan", [*GEN, "-t", "nan"], USAGE, r"webtensor: error: .*temperature must be a finite number"),
    ("temperature-inf", [*GEN, "-t", "inf"], USAGE, r"webtensor: error: .*temperature must be a finite number"),
    ("top-k-negative", [*GEN, "--top-k", "-3"], USAGE, r"webtensor: error: argument --top-k: top_k must be an "
     r"integer >= 0 \(0 or None = off\), got -3"),
    ("top-k-float", [*GEN, "--top-k", "2.5"], USAGE, r"webtensor: error: .*top_k must be an integer.*got '2\.5'"),
    ("top-p-zero", [*GEN, "--top-p", "0"], USAGE, r"webtensor: error: argument --top-p: top_p must be in \(0, 1\]"),
    ("top-p-over-one", [*GEN, "--top-p", "1.01"], USAGE, r"webtensor: error: .*top_p must be in \(0, 1\]"),
    ("seed-negative", [*GEN, "--seed", "-1"], USAGE, r"webtensor: error: argument --seed: seed must be an "
     r"integer >= 0"),
    ("seed-word", [*GEN, "--seed", "abc"], USAGE, r"webtensor: error: .*seed must be an integer"),
    ("device-unknown", ["generate", "hi", "--device", "tpu"], USAGE, r"webtensor: error: argument --device/-d: "
     r"unknown device 'tpu': expected cpu, wgpu, wgpu:N \(adapter N of `webtensor devices`\), lavapipe or auto"),
    ("dtype-unknown", [*GEN, "--dtype", "float64"], USAGE, r"webtensor: error: argument --dtype: invalid choice"),
    ("unknown-option", [*GEN, "--frobnicate"], USAGE, r"webtensor: error: unrecognized arguments: --frobnicate"),
    ("no-command", [], USAGE, r"webtensor: error: the following arguments are required: COMMAND"),
    ("unknown-command", ["train"], USAGE, r"webtensor: error: argument COMMAND: invalid choice: 'train'"),
    ("prompt-over-context", [*GEN, "-n", "300"], USAGE, r"webtensor: error: prompt of \d+ tokens \+ 300 new tokens "
     r"= \d+ exceeds the model's context of 256 positions; .*--truncate-prompt"),
    ("truncate-no-room", [*GEN, "-n", "256", "--truncate-prompt"], USAGE, r"webtensor: error: 256 new tokens leave "
     r"no room for the prompt in the model's context of 256 positions \(truncate_prompt keeps the prompt's last "
     r"tokens, but at least one must fit\); lower max_new_tokens to 255 or less$"),
    ("chat-drop-oldest-value", ["chat", "--drop-oldest=yes"], USAGE, r"webtensor: error: argument --drop-oldest: "
     r"ignored explicit argument 'yes'"),
    ("chat-blas-threads", ["chat", "--blas-threads", "-1"], USAGE, r"webtensor: error: argument --blas-threads: "
     r"--blas-threads must be an integer >= 0, got '-1'"),
    ("generate-blas-threads", [*GEN, "--blas-threads", "two"], USAGE, r"webtensor: error: argument --blas-threads: "
     r"--blas-threads must be an integer >= 0, got 'two'"),
    ("model-missing", [*GEN, "--model", "/nonexistent/ckpt"], RUNTIME, r"webtensor: error: checkpoint directory "
     r"/nonexistent/ckpt does not exist"),
    ("devices-extra", ["devices", "--all"], USAGE, r"webtensor: error: unrecognized arguments: --all"),
    ("bench-decode-zero", ["bench", "--decode", "0"], USAGE, r"webtensor: error: argument --decode: --decode must "
     r"be an integer >= 1, got '0'"),
    ("bench-prompts-word", ["bench", "--prompts", "8,x"], USAGE, r"webtensor: error: argument --prompts: "),
    ("bench-prompts-empty", ["bench", "--prompts", ","], USAGE, r"webtensor: error: argument --prompts: "),
    ("bench-prompt-over-context", ["bench", "--prompts", "1024", "--device", "cpu"], USAGE,
     r"webtensor: error: --prompts 1024: a prefill of 1024 tokens does not fit the model's context of 1024"),
    ("bench-json-folder-missing", ["bench", "--json", "/nonexistent/out.json", "--device", "cpu"], USAGE,
     r"webtensor: error: --json /nonexistent/out\.json: the folder /nonexistent does not exist"),
    ("bench-profile-on-cpu", ["bench", "--profile", "--device", "cpu", "--prompts", "8"], USAGE,
     r"webtensor: error: --profile times GPU kernels"),
    ("web-port", ["web", "--port", "70000"], USAGE, r"webtensor: error: argument --port: --port must be an "
     r"integer in \[0, 65535\], got '70000'"),
    ("web-pyodide", ["web", "--pyodide", "/", "--no-open"], USAGE, r"webtensor: error: --pyodide /: not a "
     r"Pyodide distribution"),
    ("web-model-missing", ["web", "--model", "/nonexistent/ckpt", "--no-open"], RUNTIME,
     r"webtensor: error: checkpoint directory /nonexistent/ckpt does not exist"),
]


@pytest.mark.parametrize("argv, code, pattern", [c[1:] for c in BAD_ARGS], ids=[c[0] for c in BAD_ARGS])
def test_bad_argument_is_one_line(argv, code, pattern):
    assert_one_line(webtensor(*argv), code, pattern)


@pytest.mark.parametrize("value", ["-4.95e-194", "-1e-5", "-.5", "-2E+3", "-inf", "-nan", "-1x"])
def test_negative_numbers_are_values_not_options(value):
    """argparse's own rule reads `-4.95e-194` as an option ("expected one argument"); the CLI reads
    every negative number as the option's value, so its message is the API's."""
    with pytest.raises(wt.SamplingError) as api:
        v.check_temperature(float(value) if value != "-1x" else value)
    rule = str(api.value).split(", got ")[0]
    assert_one_line(webtensor(*GEN, "-t", value), USAGE,
                    rf"webtensor: error: argument --temperature/-t: {re.escape(rule)}, got ")


def test_tokenizer_larger_than_vocab_is_a_checkpoint_error(tmp_path):
    """A config.json whose vocab_size is below the tokenizer's ids is the checkpoint's fault (exit 1),
    found before any prompt token is judged (not "token id ... out of range", exit 2)."""
    from gpt2_fixtures import make_checkpoint, make_tokenizer

    d = make_checkpoint(tmp_path / "ckpt", vocab_size=300, n_embd=32, n_layer=1, n_head=2)
    make_tokenizer(d, 400)  # a tokenizer of 400 ids beside embeddings for 300
    assert_one_line(webtensor("generate", "a prompt of many words", "--device", "cpu", "--model", str(d)), RUNTIME,
                    rf"webtensor: error: {re.escape(str(d))}: the tokenizer has 400 token ids but config\.json's "
                    r"vocab_size = 300: ids 300\.\. would have no embedding row")


BAD_ENV = [
    ("generate", GEN, dict(WEBTENSOR_DEVICE="bogus"), r"webtensor: error: WEBTENSOR_DEVICE='bogus': expected "
     r"'cpu' or 'wgpu'"),
    ("devices", ("devices",), dict(WEBTENSOR_DEVICE="quantum"), r"webtensor: error: WEBTENSOR_DEVICE='quantum'"),
    ("bench", ("bench", "--device", "cpu"), dict(WEBTENSOR_DEVICE="tpu"), r"webtensor: error: WEBTENSOR_DEVICE"),
    ("debug-flag", GEN, dict(WEBTENSOR_DEBUG="yes"), r"webtensor: error: WEBTENSOR_DEBUG='yes': expected 0 or 1"),
    ("web-pyodide-dir", ("web", "--no-open"), dict(WEBTENSOR_PYODIDE_DIR="/nonexistent"),
     r"webtensor: error: WEBTENSOR_PYODIDE_DIR=/nonexistent: not a Pyodide distribution"),
]


@pytest.mark.parametrize("argv, env, pattern", [c[1:] for c in BAD_ENV], ids=[c[0] for c in BAD_ENV])
def test_bad_environment_value_is_one_line(argv, env, pattern):
    assert_one_line(webtensor(*argv, **env), USAGE, pattern)


def test_debug_shows_the_traceback():
    r = webtensor(*GEN, "--model", "/nonexistent/ckpt", WEBTENSOR_DEBUG="1")
    err = r.stderr.decode()
    assert r.returncode == RUNTIME and "Traceback (most recent call last)" in err and "CheckpointError" in err
    assert err.splitlines()[-1] == "webtensor: error: checkpoint directory /nonexistent/ckpt does not exist"


@pytest.mark.parametrize("data", [b"\xff\xfe hello", b"caf\xe9", b"ok \xed\xa0\x80 surrogate"],
                         ids=["ff", "latin-1", "encoded-surrogate"])
def test_non_utf8_stdin_is_one_line(data):
    try:
        data.decode("utf-8")
        pytest.fail("the case must not be UTF-8")
    except UnicodeDecodeError as e:
        bad = e.start
    assert_one_line(webtensor("generate", "--device", "cpu", stdin=data), USAGE,
                    rf"webtensor: error: stdin is not UTF-8 text: byte 0x{data[bad]:02x} at offset {bad}")


def test_undecodable_argv_prompt_is_one_line():
    assert_one_line(webtensor("generate", b"caf\xe9", "--device", "cpu"), USAGE,
                    r"webtensor: error: the prompt is not valid UTF-8 text")


def test_empty_stdin_prompt_is_refused():
    assert_one_line(webtensor("generate", "--device", "cpu"), USAGE,
                    r"webtensor: error: the prompt is empty: give at least one token")


def test_generate_works_and_top_k_zero_means_off():
    r = webtensor("generate", "--device", "cpu", "-n", "4", "--top-k", "0", "--seed", "1", stdin=b"Once upon")
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().startswith("Once upon") and len(r.stdout) > len(b"Once upon\n")
    assert "Traceback" not in r.stderr.decode()


# -- a closed stdout ------------------------------------------------------------------------------
# The prompt is echoed first: one larger than a pipe's buffer (64 KiB) blocks on the write until
# the reader goes, so the pipe is sure to be closed while webtensor is still writing.
BIG_PROMPT = "the cat sat on the mat. " * 4000


def _quiet_on_closed_pipe(rc: int, err: str) -> None:
    assert rc in (CLOSED_PIPE, 0), (rc, err)
    assert "Error" not in err and "Traceback" not in err and "Exception ignored" not in err, err
    assert not [x for x in err.splitlines() if not x.startswith("[webtensor] model")], err


def test_closed_stdout_pipe_is_quiet():
    p = subprocess.Popen([sys.executable, "-m", "webtensor", "generate", "--device", "cpu", "-n", "5",
                          "--truncate-prompt", BIG_PROMPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, env=_env())
    assert p.stdout.read(10) == BIG_PROMPT[:10].encode()
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(60) == CLOSED_PIPE, err
    _quiet_on_closed_pipe(CLOSED_PIPE, err)


def test_piped_into_head_is_quiet(tmp_path):
    (tmp_path / "prompt.txt").write_text(BIG_PROMPT)
    script = (f'"{sys.executable}" -m webtensor generate --device cpu -n 5 --truncate-prompt < prompt.txt '
              '2> err.txt | head -c 10; echo " ${PIPESTATUS[0]}"')
    out = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                         timeout=60).stdout
    text, rc = out.rsplit(" ", 1)
    assert text == BIG_PROMPT[:10]
    _quiet_on_closed_pipe(int(rc), (tmp_path / "err.txt").read_text())


# -- Ctrl-C -----------------------------------------------------------------------------------------
def _interrupt(p: subprocess.Popen, ready: bytes) -> tuple[int, str]:
    """Wait until the process has written `ready` to stdout, send SIGINT, return (exit code, stderr)."""
    seen = b""
    while ready not in seen:
        chunk = p.stdout.read1(4096)
        assert chunk, f"exited early: {p.wait()} {p.stderr.read().decode()}"
        seen += chunk
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    return p.returncode, err.decode()


def test_ctrl_c_while_generating():
    # the real CLI with sampling slowed down, so that SIGINT lands mid-generation
    code = ("import time, webtensor.sampling as s; fast = s.sample\n"
            "s.sample = lambda *a: (time.sleep(0.05), fast(*a))[1]\n"
            "import sys; from webtensor.cli import main; sys.exit(main(sys.argv[1:]))")
    p = subprocess.Popen([sys.executable, "-c", code, "generate", "--device", "cpu", "-n", "200", "--top-k", "0",
                          "--top-p", "1", "Once upon a time"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, env=_env())
    t0 = time.perf_counter()
    rc, err = _interrupt(p, b"Once upon a time")
    assert time.perf_counter() - t0 < 200 * 0.05, "generation finished before the interrupt"
    assert rc == INTERRUPTED, err
    assert "Traceback" not in err and err.splitlines()[-1] == "webtensor: interrupted", err
    assert [x for x in err.splitlines() if not x.startswith("[webtensor] model")] == ["webtensor: interrupted"]


def test_ctrl_c_while_reading_stdin():
    p = subprocess.Popen([sys.executable, "-c", "import sys; print('up', flush=True); from webtensor.cli import "
                          "main; sys.exit(main(['generate', '--device', 'cpu']))"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, stdin=subprocess.PIPE, env=_env())
    time.sleep(0.5)  # past the imports, into the read of stdin
    rc, err = _interrupt(p, b"up")
    assert rc == INTERRUPTED and err.strip() == "webtensor: interrupted", (rc, err)


# -- the API: the same rules, the same messages -----------------------------------------------------
@pytest.fixture(scope="module")
def model() -> GPT2:
    return GPT2.from_pretrained(None, device="cpu")


VOCAB = 4096  # the shipped model's
not_int = st.one_of(st.floats(allow_nan=True), st.text(max_size=3), st.booleans(), st.none(),
                    st.lists(st.integers(0, 9), min_size=1, max_size=2), st.just(np.float32(3.0)),
                    st.just(np.bool_(True)))


@settings(max_examples=60, deadline=None)
@given(good=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6), bad=not_int, at=st.integers(0, 6))
def test_ids_with_a_non_int_are_refused(good, bad, at):
    ids = good[:at] + [bad] + good[at:]
    with pytest.raises(wt.SamplingError, match=r"token ids must be ints|token id|expected token ids"):
        v.check_ids(ids, VOCAB)


@settings(max_examples=60, deadline=None)
@given(ids=st.lists(st.integers(-2**40, 2**40), min_size=1, max_size=8),
       kind=st.sampled_from([list, tuple, np.array]))
def test_ids_in_range_accepted_out_of_range_refused(ids, kind):
    seq = kind(ids)
    if all(0 <= i < VOCAB for i in ids):
        assert v.check_ids(seq, VOCAB) == ids
    else:
        first = next(i for i in ids if not 0 <= i < VOCAB)
        with pytest.raises(wt.SamplingError, match=rf"token id {first} is out of range for a vocabulary of {VOCAB}"):
            v.check_ids(seq, VOCAB)


@pytest.mark.parametrize("ids, pattern", [
    ([[10, 20], [30, 40]], r"the id at position 0 is a nested sequence"),
    (np.array([[10, 20], [30, 40]]), r"must be a 1-D sequence, got an array of 2 dimensions"),
    (np.int64(5), r"must be a 1-D sequence, got an array of 0 dimensions"),
    (np.array([1.0, 2.0]), r"the id at position 0 is .*float64"),
    ([1, 2.0], r"the id at position 1 is 2\.0 \(float\)"),
    ([True, 2], r"the id at position 0 is True \(bool\)"),
    (["1", "2"], r"the id at position 0 is '1' \(str\)"),
    ("hello", r"expected token ids; use model\.stream\(text\)"),
    (b"\x01\x02", r"expected token ids"),
    ({1: 2}, r"must be a 1-D sequence of ints, got dict"),
    (7, r"must be a 1-D sequence of ints, got int"),
    ([], r"the prompt is empty"),
])
def test_generate_refuses_bad_ids(model, ids, pattern):
    with pytest.raises(wt.SamplingError, match=pattern):
        model.generate(ids, 2)


def test_generate_accepts_numpy_ids(model):
    assert model.generate(np.array([5, 6, 7], np.int32), 3) == model.generate([5, 6, 7], 3)


def _valid(name: str, x: object) -> bool:
    """The documented rule for each parameter, written out independently of validate.py."""
    is_int = isinstance(x, int | np.integer) and not isinstance(x, bool | np.bool_)
    is_num = isinstance(x, int | float | np.integer | np.floating) and not isinstance(x, bool | np.bool_)
    return {
        "temperature": is_num and math.isfinite(x) and x >= 0,
        "top_k": x is None or (is_int and x >= 0),
        "top_p": x is None or (is_num and 0 < x <= 1),
        "seed": x is None or (is_int and x >= 0),
        "max_new_tokens": is_int and x >= 1,
    }[name]


anything = st.one_of(st.integers(-5, 5), st.floats(-2, 2), st.floats(allow_nan=True, allow_infinity=True),
                     st.none(), st.booleans(), st.text(max_size=2), st.just([1]), st.just(np.int32(2)),
                     st.just(np.float32(0.5)))
CHECKS = {"temperature": v.check_temperature, "top_k": v.check_top_k, "top_p": v.check_top_p,
          "seed": v.check_seed, "max_new_tokens": v.check_max_new_tokens}


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(sorted(CHECKS)), x=anything)
def test_sampling_parameters_refused_exactly_when_invalid(name, x):
    if _valid(name, x):
        CHECKS[name](x)
    else:
        with pytest.raises(wt.SamplingError, match=rf"^{name} must be .*, got "):
            CHECKS[name](x)


def test_top_k_zero_means_off(model):
    assert v.check_top_k(0) is None
    ids = [5, 6, 7]
    assert model.generate(ids, 4, temperature=1.0, top_k=0, seed=3) == model.generate(ids, 4, temperature=1.0,
                                                                                       seed=3)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["temperature", "top_k", "top_p", "seed", "max_new_tokens"]),
       x=st.one_of(st.integers(-5, 0), st.floats(-3, 3), st.just(float("nan"))))
def test_cli_and_api_give_the_same_message(capsys, model, name, x):
    if _valid(name, x):
        return
    api = {"max_new_tokens": 2, name: x}
    with pytest.raises(wt.SamplingError) as e:
        model.generate([5, 6], **api)
    flag = {"max_new_tokens": "-n", "top_k": "--top-k", "top_p": "--top-p", "temperature": "-t",
            "seed": "--seed"}[name]
    assert main(["generate", "hi", "--device", "cpu", flag, str(x)]) == USAGE
    err = capsys.readouterr().err.strip()
    rule = str(e.value).split(", got ")[0]  # the value's spelling differs: the CLI parsed text
    assert err.startswith("webtensor: error: argument ") and f": {rule}, got " in err, (err, rule)


def test_ctrl_c_stops_the_web_server(tmp_path):
    for name in ("pyodide.js", "pyodide.asm.wasm"):  # enough of a Pyodide folder to start serving
        (tmp_path / name).write_bytes(b"")
    p = subprocess.Popen([sys.executable, "-m", "webtensor", "web", "--no-open", "--port", "0", "--pyodide",
                          str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, env=_env())
    rc, err = _interrupt(p, b"Ctrl-C stops")
    assert rc == INTERRUPTED and err.strip() == "webtensor: interrupted", (rc, err)
