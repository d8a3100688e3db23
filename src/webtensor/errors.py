"""The exceptions webtensor raises. Every one derives from `WebtensorError`."""

from __future__ import annotations


class WebtensorError(Exception):
    """Base class of every error webtensor raises on purpose."""


class ShapeError(WebtensorError, ValueError):
    """Operand shapes do not fit the operation; the message names the shapes."""


class DTypeError(WebtensorError, TypeError):
    """A dtype the operation or device does not support."""


class ArgumentError(WebtensorError, ValueError):
    """A non-tensor argument is invalid (an option name, eps, ...); the message names it and its value."""


class DeviceMismatchError(WebtensorError, ValueError):
    """Tensors on two different devices were combined; the message names both."""


class NoAdapterError(WebtensorError, RuntimeError):
    """No WebGPU adapter was found (or not the kind that was asked for)."""


class DeviceReleasedError(WebtensorError, RuntimeError):
    """A tensor was used after its device was released."""


class BufferLimitError(WebtensorError, ValueError):
    """A buffer larger than the device allows was requested."""


class GPUError(WebtensorError, RuntimeError):
    """The GPU reported a validation error, ran out of memory, or was lost; names the op."""


class CheckpointError(WebtensorError, ValueError):
    """A model checkpoint is missing, unsafe (pickle) or corrupt; says where and what."""


class TokenizerError(CheckpointError):
    """Tokenizer files are missing, unreadable or of a kind webtensor refuses (a CheckpointError)."""


class ChatTemplateError(WebtensorError, ValueError):
    """A chat template cannot render a conversation: a template syntax error, the template refusing the
    conversation (its `raise_exception`, e.g. roles that do not alternate), malformed messages, or a template
    that fails while rendering; one line saying which."""


class ContextLengthError(WebtensorError, ValueError):
    """A prompt plus the tokens to generate does not fit the model's context."""


class SamplingError(WebtensorError, ValueError):
    """Invalid generation parameters (temperature, top-k, top-p, max_new_tokens, prompt)."""


class UsageError(WebtensorError, ValueError):
    """A setting the user chose is invalid: a command-line argument, an environment variable
    (WEBTENSOR_DEVICE=...), or input such as non-UTF-8 text on stdin; the message names it."""


class GraphCaptureError(WebtensorError, RuntimeError):
    """A graph capture was misused: an upload or readback inside it, or a capture inside a capture."""
