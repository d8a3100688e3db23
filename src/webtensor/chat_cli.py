"""`webtensor chat`: a conversation with a model in the terminal, each reply streamed as it forms.

A line is a message (several lines between triple quotes, as in Ollama's chat); a line starting with "/" is a
command (`COMMANDS`, listed by /help; "//" sends a message that starts with "/"). The conversation
(`conversation.Conversation`) renders through the model's chat template, and each reply ends where the template's
turn ends (`chat.turn_stops`: a model without a template stops at the next "User:"). The session survives its
errors: a line that is not UTF-8, a message the template refuses, a conversation past the context (said so, with
/reset; `--drop-oldest` drops the oldest exchanges instead), a generation that fails -- each is one `webtensor:
error:` line on stderr, and the next message is read. Ctrl-C during a reply stops the reply (what was said stays in
the conversation); a second one interrupts at once; Ctrl-C at the prompt ends the session (exit status 130), Ctrl-D,
/exit or /bye end it with 0. A reply cut by the context or by -n says so.

The replies go to stdout, everything else (the prompt, notes, errors) to stderr. With a terminal, the input line
is edited with readline; with a pipe, each line of stdin is a message and nothing but the replies reach stdout.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from . import cmdline, validate
from .chat import check_template
from .errors import ChatTemplateError, ContextLengthError, SamplingError, UsageError, WebtensorError

COMMANDS = {  # name -> (aliases, arguments, what it does)
    "/help": (("/?",), "", "list the commands"),
    "/reset": (("/clear",), "", "start the conversation over (the system message stays)"),
    "/system": ((), "[TEXT]", "set the system message (the conversation goes on); without TEXT, show it"),
    "/exit": (("/bye", "/quit"), "", "end the session (so does Ctrl-D)"),
}
ALIASES = {alias: name for name, (aliases, _, _) in COMMANDS.items() for alias in (name, *aliases)}
QUOTES = '"""'  # a message of several lines: between these, as in Ollama's chat


def _usage(cmd: str, aliases: tuple[str, ...], arguments: str, what: str) -> str:
    return f"  {' '.join((cmd, *aliases, arguments)).strip():22} {what}"


def add_parser(sub: Any) -> None:
    from .generate_cli import model_args

    commands = "\n".join(_usage(cmd, *rest) for cmd, rest in COMMANDS.items())
    c = cmdline.add_command(sub, "chat", run=run_chat, check=check_chat,
                            help="chat with a model in the terminal, the replies streamed (its chat template)",
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            description="A message a line (several lines between \"\"\" quotes), each reply "
                                        "streamed. Commands:\n" + commands + "\nCtrl-C stops a reply; Ctrl-D (or "
                                        "Ctrl-C at the prompt) ends the session.")
    model_args(c, 0.7)
    c.add_argument("--system", default=None, help="a system message to start the conversation with")
    cmdline.add_chat_template(c)
    c.add_argument("--hide-thinking", action="store_true",
                   help="leave out a reasoning model's thinking (its <think> block; default: shown dimmed)")
    c.add_argument("--drop-oldest", action="store_true",
                   help="when the conversation outgrows the context, drop its oldest exchanges (the system message "
                        "stays) to leave room for a reply of -n tokens, or a quarter of the context; default: say "
                        "so, and /reset starts over")


def check_chat(args: argparse.Namespace) -> None:
    """The arguments, the checkpoint and its chat template (rendered on small conversations, with --system if
    given), before any weights load."""
    from .generate_cli import open_checkpoint

    if args.system is not None:
        validate.check_text(args.system)
    ck = args.checkpoint = open_checkpoint(args)
    which = "the model's chat template"
    if args.chat_template is not None:
        ck.chat_template = cmdline.chat_template_file(args.chat_template)
        which = f"the chat template {args.chat_template}"
    try:
        check_template(ck)
    except ChatTemplateError as e:
        raise ChatTemplateError(f"{which} cannot hold a conversation: {e}") from None
    if args.system is not None:
        try:
            check_template(ck, args.system)
        except ChatTemplateError as e:
            raise UsageError(f"--system: {e}") from None


def run_chat(args: argparse.Namespace) -> int:
    from .conversation import Conversation
    from .generate_cli import load, sampling

    model = load(args)
    session = Session(model, Conversation(model, args.system, args.drop_oldest, args.max_new_tokens), sampling(args),
                      hide_thinking=args.hide_thinking)
    return session.run()


class Session:
    """The terminal side of a conversation: reads lines, runs commands, streams replies, reports what went wrong."""

    def __init__(self, model: Any, conversation: Any, sampling: dict[str, Any], hide_thinking: bool = False):
        self.model, self.conversation, self.sampling = model, conversation, sampling
        self.hide_thinking = hide_thinking
        self.dim_thinking = sys.stdout.isatty() and "NO_COLOR" not in os.environ
        self.thought = False  # thinking was shown and its last line is not ended
        self.typing = sys.stdin.isatty()  # a person at a terminal: show a prompt
        self.editing = self.typing and sys.stdout.isatty()  # input() with readline (it writes its prompt to stdout)
        self.dim = sys.stderr.isatty() and "NO_COLOR" not in os.environ
        self.line_number = 0

    def run(self) -> int:
        """The session: 0 at the end of input or on /exit, 130 for Ctrl-C at the prompt."""
        if self.editing:
            try:
                import readline  # noqa: F401  (line editing and history for input())
            except ImportError:
                pass
        if self.typing:
            self.note("chat: type a message and Enter; /help lists the commands; Ctrl-D or /bye ends")
        while True:
            try:
                line = self.read()
                block = line is not None and line.strip().startswith(QUOTES)
                if block:
                    line = self.read_block(line.strip()[len(QUOTES):])  # type: ignore[union-attr]
            except KeyboardInterrupt:
                self.end_line()
                return cmdline.EXIT_INTERRUPT
            except UsageError as e:  # a line that is not text: said, and the next one read
                self.error(str(e))
                continue
            if line is None:
                self.end_line()
                return cmdline.EXIT_OK
            text = line.strip()
            if block:
                if text:
                    self.turn(text)
            elif text.startswith("/") and not text.startswith("//"):
                if not self.command(text):
                    return cmdline.EXIT_OK
            elif text:
                self.turn(text[1:] if text.startswith("//") else text)

    # -- input ----------------------------------------------------------------------------------------------
    def read_block(self, first: str) -> str:
        """A message of several lines between triple quotes, as Ollama's chat takes one: `first` (what followed the
        opening quotes) and the lines after it up to one that ends with the closing quotes (or the end of input)."""
        lines = [first]
        while not lines[-1].rstrip().endswith(QUOTES) or lines == [""]:
            line = self.read("... ")
            if line is None:
                break
            lines.append(line)
        return "\n".join(lines).rstrip().removesuffix(QUOTES)

    def read(self, prompt: str = "> ") -> str | None:
        """The next line (without its line end), None at the end of input. UsageError for a line that is not UTF-8
        (the line is skipped: the next read goes on after it)."""
        self.line_number += 1
        if self.editing:
            try:
                line = input(prompt)
            except EOFError:
                return None
            except UnicodeDecodeError as e:  # (stdin's errors="strict")
                raise UsageError(self._not_utf8(e.object[e.start], e.start, e.reason)) from None
            try:
                line.encode("utf-8")
            except UnicodeEncodeError as e:  # (stdin's errors="surrogateescape": the byte as a lone surrogate)
                raise UsageError(self._not_utf8(ord(line[e.start]) - 0xDC00, e.start, "not UTF-8")) from None
            return line
        if self.typing:
            self.say(prompt, end="")
        raw = sys.stdin.buffer.readline()
        if not raw:
            return None
        if self.line_number == 1:
            raw = raw.removeprefix(b"\xef\xbb\xbf")  # a byte-order mark
        try:
            return raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as e:
            raise UsageError(self._not_utf8(raw[e.start], e.start, e.reason)) from None

    def _not_utf8(self, byte: int, offset: int, reason: str) -> str:
        return (f"line {self.line_number} is not UTF-8 text: byte 0x{byte & 0xFF:02x} at offset {offset} ({reason}); "
                "it was not sent")

    # -- commands -------------------------------------------------------------------------------------------
    def command(self, text: str) -> bool:
        """Run the command `text` ("/name args"); False to end the session."""
        word, _, rest = text.partition(" ")
        name = ALIASES.get(word.lower())
        if name is None:
            self.error(f"unknown command {word}: /help lists the commands (start a message with // to send one that "
                       "begins with /)")
        elif name == "/exit":
            return False
        elif name == "/help":
            for cmd, (aliases, arguments, what) in COMMANDS.items():
                self.say(_usage(cmd, aliases, arguments, what))
            self.say(f"  {'//TEXT':22} send a message that starts with /")
            self.say(f"  {QUOTES + 'TEXT' + QUOTES:22} send a message of several lines (the closing quotes may end a "
                     "later line)")
            self.say("  Ctrl-C stops a reply; Ctrl-D (or Ctrl-C at the prompt) ends the session")
        elif name == "/reset":
            self.conversation.reset()
            self.note("the conversation starts over")
        elif name == "/system":
            self.system(rest.strip())
        return True

    def system(self, text: str) -> None:
        conv = self.conversation
        if not text:
            self.say(f"system message: {conv.system}" if conv.system is not None else "no system message")
            return
        try:
            check_template(self.model, text)
        except ChatTemplateError as e:
            self.error(f"/system: {e}")
            return
        conv.set_system(text)
        self.note("system message set")

    # -- a turn ---------------------------------------------------------------------------------------------
    def turn(self, text: str) -> None:
        """Answer the message `text`; whatever goes wrong is said and leaves the conversation as it was."""
        conv = self.conversation
        try:
            turn = conv.prepare(text)
        except KeyboardInterrupt:  # (Ctrl-C while the prompt is rendered: nothing was sent)
            self.end_line()
            self.note("the message was not sent")
            return
        except ContextLengthError as e:
            if conv.drop_oldest or not conv.history:  # the message alone does not fit
                self.error(f"{e}: shorten the message, or give the chat a larger --ctx-size")
            else:
                self.error(f"{e}: /reset starts the conversation over; --drop-oldest drops the oldest exchanges "
                           "instead")
            return
        except (ChatTemplateError, SamplingError) as e:
            self.error(str(e))
            return
        if turn.dropped:
            self.note(f"dropped the {turn.dropped} oldest exchange{'s' if turn.dropped > 1 else ''} to make room in "
                      f"the context of {self.model.n_ctx} positions")
        reply = conv.reply(turn, **self.sampling)
        try:
            with _stopped_by_sigint(reply.stop):
                thinking = self.thinking(turn)
                for piece in reply:
                    self.write(thinking, piece)
                self.write(thinking, None)
        except KeyboardInterrupt:  # a second Ctrl-C: the reply stops where it is
            pass
        except BrokenPipeError:
            raise  # stdout is gone: the session ends (cmdline.run_main)
        except WebtensorError as e:
            self.end_reply(reply)
            self.error(f"{e} (the message was not kept)")
            return
        except Exception as e:  # noqa: BLE001 - a bug: said, and the session goes on
            self.end_reply(reply)
            self.error(f"internal error: {type(e).__name__}: {e} (a bug: please report it; the message was not kept)")
            return
        self.end_reply(reply)
        conv.commit(turn, reply)
        if reply.finish == "interrupted":
            self.note("reply stopped")
        elif reply.finish == "context":
            then = ("the next message drops the oldest exchanges" if conv.drop_oldest else
                    "/reset starts over; --drop-oldest drops the oldest exchanges instead")
            self.note(f"reply cut: the context of {self.model.n_ctx} positions is full ({then})")
        elif reply.finish == "length":
            self.note(f"reply cut at -n {reply.n_tokens} tokens")

    def thinking(self, turn: Any) -> Any:
        """For a model whose template writes <think> blocks: the splitter of the reply into its thinking and its
        answer (`serve.reply.ThinkSplitter`; the prompt may have opened the block), else None."""
        from .serve.reply import ThinkSplitter, starts_thinking, thinks

        self.thought = False
        if not thinks(self.model.chat_template):
            return None
        return ThinkSplitter(starts_thinking(self.model.tokenizer.decode(turn.ids, skip_special_tokens=False)))

    def write(self, thinking: Any, piece: str | None) -> None:
        """A piece of the reply (None: its end): the thinking dimmed (on a terminal; left out with
        --hide-thinking), a line break after it, the answer as it is."""
        if thinking is None:
            if piece is not None:
                cmdline.write(piece)
            return
        reasoning, answer = thinking.feed(piece or "", final=piece is None)
        if reasoning and not self.hide_thinking:
            cmdline.write(f"\x1b[2m{reasoning}\x1b[22m" if self.dim_thinking else reasoning)
            self.thought = not reasoning.endswith("\n")
        if answer:
            if self.thought:
                cmdline.write("\n")
            self.thought = False
            cmdline.write(answer)

    def end_reply(self, reply: Any) -> None:
        if reply.n_tokens or reply.text:
            cmdline.write("\n")

    # -- output ---------------------------------------------------------------------------------------------
    def say(self, text: str, end: str = "\n") -> None:
        print(text, end=end, file=sys.stderr, flush=True)

    def note(self, text: str) -> None:
        """A remark about the session (not the model's words): on stderr, dimmed on a terminal."""
        self.say(f"\x1b[2m[{text}]\x1b[0m" if self.dim else f"[{text}]")

    def error(self, text: str) -> None:
        self.say(f"{cmdline.PROG}: error: {text}")

    def end_line(self) -> None:
        if self.typing:
            self.say("")


class _stopped_by_sigint:
    """While active, the first SIGINT (Ctrl-C) calls `stop` instead of raising KeyboardInterrupt (the reply ends at
    its next token, cleanly); a second one raises KeyboardInterrupt as usual."""

    def __init__(self, stop: Callable[[], None]):
        self.stop = stop
        self.previous: Any = None

    def __enter__(self) -> None:
        def on_sigint(signum: int, frame: Any) -> None:
            self.stop()
            signal.signal(signal.SIGINT, signal.default_int_handler)

        self.previous = signal.signal(signal.SIGINT, on_sigint)

    def __exit__(self, *exc: Any) -> None:
        signal.signal(signal.SIGINT, self.previous)
