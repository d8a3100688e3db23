"""What every `webtensor` command shares: one line on stderr for every failure, documented exit codes.

A command is a subparser made by `add_command(sub, name, run=..., check=...)`. `run_main` parses
the arguments, checks the environment (`ENVIRONMENT`), calls the command's `check(args)` (all
argument checks, before any model is loaded or anything printed), then `run(args)`, and turns
what goes wrong into one line on stderr and an exit code:

    0    success
    1    runtime error: a missing or bad checkpoint, no WebGPU adapter, a GPU failure, an OS error
    2    usage error: a bad argument or environment value, non-UTF-8 input, a prompt that does not fit
    130  interrupted (Ctrl-C)
    141  stdout was closed early (`webtensor generate ... | head`): quiet, like other Unix tools

WEBTENSOR_DEBUG=1 prints the traceback before the line. The argparse `type=` helpers (`integer`,
`checked`, `device_name`) reject bad values while parsing, with the same messages as the API.
"""

from __future__ import annotations

import argparse
import os
import re
import select
import sys
import traceback
import warnings
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from .errors import ContextLengthError, SamplingError, UsageError, WebtensorError

EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, EXIT_INTERRUPT, EXIT_CLOSED_PIPE = 0, 1, 2, 130, 141
USAGE_ERRORS: tuple[type[Exception], ...] = (UsageError, SamplingError, ContextLengthError)
PROG = "webtensor"
T = TypeVar("T")


# -- parsers and commands -----------------------------------------------------------------------
# what an option's value may look like although it starts with "-": any number argparse's own rule
# misses (-1e-5, -4.95e-194, -.5e3, -inf, -nan), so `-t -4.95e-194` reaches the type check (and the
# API's message) instead of being read as an unknown option
NEGATIVE_NUMBER = re.compile(r"^-(\d|\.\d|inf(inity)?$|nan$)", re.IGNORECASE)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are UsageErrors (one line) instead of usage text + exit 2, and
    which reads any negative number (`NEGATIVE_NUMBER`) as a value, never as an option."""

    def _parse_optional(self, arg_string: str) -> Any:
        # (argparse's hook that tells options from values; subparsers are Parsers too. Checked
        # first, so that `-nan` is not read as `-n an` either.)
        if NEGATIVE_NUMBER.match(arg_string):
            return None
        return super()._parse_optional(arg_string)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def add_command(sub: argparse._SubParsersAction[Parser], name: str, *, run: Callable[[argparse.Namespace], int],
                check: Callable[[argparse.Namespace], None] | None = None, **kw: Any) -> Parser:
    """A subcommand of `sub` (an add_subparsers() result of a Parser): `check(args)` runs before
    `run(args)`; `run` returns the exit code."""
    p = sub.add_parser(name, **kw)
    p.set_defaults(func=run, check=check)
    return p


def checked(api_check: Callable[[Any], T], parse: Callable[[str], Any] = int) -> Callable[[str], T]:
    """An argparse type: `parse` the text (int, float), then `api_check` it (a validate.check_*),
    so the CLI refuses a value with the API's message. Text that does not parse is checked as is
    (the check then names it)."""

    def convert(text: str) -> T:
        try:
            value = parse(text)
        except ValueError:
            value = text
        try:
            return api_check(value)
        except WebtensorError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = getattr(api_check, "__name__", "value")
    return convert


def integer(what: str, minimum: int | None = None, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in [minimum, maximum] (either bound optional)."""

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            rng = f" in [{minimum}, {maximum}]" if minimum is not None and maximum is not None else (
                f" >= {minimum}" if minimum is not None else (f" <= {maximum}" if maximum is not None else ""))
            raise argparse.ArgumentTypeError(f"{what} must be an integer{rng}, got {text!r}")
        return value

    convert.__name__ = what
    return convert


def int_list(what: str, minimum: int = 1) -> Callable[[str], list[int]]:
    """An argparse type: comma-separated integers, each >= minimum, at least one."""
    one = integer(what, minimum)

    def convert(text: str) -> list[int]:
        parts = [x.strip() for x in text.split(",")]
        if not any(parts) or not all(parts):
            raise argparse.ArgumentTypeError(f"{what} must be comma-separated integers >= {minimum}, got {text!r}")
        return [one(x) for x in parts]

    convert.__name__ = what
    return convert


DTYPE_CHOICES = ("auto", "float32", "float16", "q8_0", "int8")  # a model's --dtype (models.loader.check_dtype)


PLAIN_TEMPLATE = "plain"  # --chat-template's name for webtensor's plain "User: / Assistant:" template


def add_chat_template(p: argparse.ArgumentParser) -> None:
    """`--chat-template FILE|plain`, as `chat` and `serve` take it; `chat_template_file` reads it."""
    p.add_argument("--chat-template", default=None, metavar="FILE|plain",
                   help="render conversations with this jinja2 template file (or 'plain': webtensor's "
                        "'User: / Assistant:' one) instead of the model's own")


def chat_template_file(value: str) -> str | None:
    """The template `--chat-template value` names: the file's text, or None for `PLAIN_TEMPLATE`. UsageError for a
    file that cannot be read as UTF-8 text."""
    if value == PLAIN_TEMPLATE:
        return None
    try:
        with open(value, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise UsageError(f"--chat-template {value}: cannot read it ({why}); give a jinja2 file or 'plain'") from None


def add_blas_threads(p: argparse.ArgumentParser) -> None:
    """`--blas-threads N` (default 1), as `generate`, `chat` and `serve` take it; `use_blas_threads` applies it."""
    p.add_argument("--blas-threads", type=integer("--blas-threads", 0), default=1,
                   help="threads of numpy's BLAS, which runs the CPU device's products (default 1: its extra "
                        "threads spin and take the cores the rest of the work needs); 0 keeps the library's own count")


def use_blas_threads(n: int) -> None:
    """Give numpy's BLAS `n` threads from now on (0: leave it as it is; see `backends.blas`)."""
    if n:
        from .backends import blas

        blas.set_threads(n)


def device_name(text: str) -> str:
    """An argparse type: a device name (auto, cpu, wgpu, wgpu:N, lavapipe and aliases), checked without
    creating the device; returns the kind."""
    from .device import device_spec

    try:
        return device_spec(text)
    except WebtensorError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# -- environment --------------------------------------------------------------------------------
def _flag(name: str) -> Callable[[str], None]:
    def check(value: str) -> None:
        if value.strip() not in ("", "0", "1"):
            raise UsageError(f"{name}={value!r}: expected 0 or 1")

    return check


def _device_env(value: str) -> None:
    from .device import env_device

    env_device()  # reads the variable itself


# Environment variables every command checks before it starts: name -> check(value), which
# raises UsageError. Commands with variables of their own add them here (or check them in `check`).
ENVIRONMENT: dict[str, Callable[[str], None]] = {
    "WEBTENSOR_DEVICE": _device_env,
    "WEBTENSOR_DEBUG": _flag("WEBTENSOR_DEBUG"),
    "WEBTENSOR_RAW_ENCODE": _flag("WEBTENSOR_RAW_ENCODE"),
    "WEBTENSOR_SHADER_CHECKS": _flag("WEBTENSOR_SHADER_CHECKS"),
}


def check_environment() -> None:
    for name, check in ENVIRONMENT.items():
        value = os.environ.get(name)
        if value is not None:
            check(value)


def debug() -> bool:
    return os.environ.get("WEBTENSOR_DEBUG", "").strip() == "1"


# -- input and output ---------------------------------------------------------------------------
def read_stdin_text() -> str:
    """All of stdin as text: UTF-8 (a leading byte-order mark dropped); UsageError otherwise."""
    if sys.stdin is None:
        raise UsageError("no prompt: give it as an argument or on stdin (stdin is closed)")
    data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UsageError(f"stdin is not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start} "
                         f"({e.reason}); give the prompt as UTF-8") from None


def write(text: str) -> None:
    """Text to stdout, flushed at once (a closed pipe surfaces here, and `run_main` quiets it)."""
    sys.stdout.write(text)
    sys.stdout.flush()


def _one_line_warning(message: Any, category: type[Warning], filename: str, lineno: int,
                      file: Any = None, line: str | None = None) -> None:
    text = str(message).removeprefix(f"{PROG}: ")
    _say(f"{PROG}: warning: {text}")


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr closed too: nothing more can be said
        pass


def _stdout_closed() -> bool:
    """After a BrokenPipeError: is it stdout whose reader went? (A pipe without readers polls as
    an error.) False when that cannot be told, so the error is reported rather than hidden."""
    try:
        fd = sys.stdout.fileno()
        if not hasattr(select, "poll"):
            return True  # no poll (Windows): stdout is the likeliest pipe
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's flush at exit does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


# -- the wrapper --------------------------------------------------------------------------------
def exit_code(e: BaseException) -> int:
    """The exit code for an error: 2 for usage errors, 1 for the rest."""
    return EXIT_USAGE if isinstance(e, USAGE_ERRORS) else EXIT_RUNTIME


def run_main(build: Callable[[], argparse.ArgumentParser], argv: list[str] | None = None) -> int:
    """Parse `argv`, check, run; every failure becomes one stderr line and an exit code (above)."""
    shown, warnings.showwarning = warnings.showwarning, _one_line_warning
    try:
        check_environment()
        args = build().parse_args(argv)
        check = getattr(args, "check", None)
        if check is not None:
            check(args)
        code: int = args.func(args)  # (`add_command`'s run)
        return code
    except KeyboardInterrupt:
        return _fail("interrupted", EXIT_INTERRUPT)
    except BrokenPipeError:
        if _stdout_closed():
            if debug():
                traceback.print_exc()
            _silence_stdout()
            return EXIT_CLOSED_PIPE
        return _fail(f"error: {_describe_os_error(sys.exc_info()[1])}", EXIT_RUNTIME)
    except WebtensorError as e:
        return _fail(f"error: {e}", exit_code(e))
    except OSError as e:
        return _fail(f"error: {_describe_os_error(e)}", EXIT_RUNTIME)
    except Exception as e:
        hint = "" if debug() else "; WEBTENSOR_DEBUG=1 shows the traceback"
        return _fail(f"internal error: {type(e).__name__}: {e} (a bug: please report it{hint})", EXIT_RUNTIME)
    finally:
        warnings.showwarning = shown


def _describe_os_error(e: BaseException | None) -> str:
    if isinstance(e, OSError) and e.strerror:
        where = f": {e.filename}" if e.filename else ""
        return f"{e.strerror}{where}"
    return str(e)


def _fail(what: str, code: int) -> int:
    if debug():
        traceback.print_exc()
    _say(f"{PROG}: {what}")
    return code
