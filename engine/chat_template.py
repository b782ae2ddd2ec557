"""Sandboxed Jinja rendering of Hugging Face and GGUF chat templates.

A chat template is Jinja code shipped with a model, so it is untrusted: it renders in jinja2's
ImmutableSandboxedEnvironment with the globals, filters and settings Hugging Face templates expect, bounded in
time and memory (engine/chat_template_limits.py: 2 s, 4 MB of output), and everything the template sees is
rebuilt from plain JSON-like values first. Whatever goes wrong inside a template (syntax, a `raise_exception`,
undefined names, a sandbox breach, a limit) surfaces as a `ChatTemplateError` naming the cause.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import threading
import types
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from jinja2 import BaseLoader, TemplateError, TemplateNotFound, TemplateSyntaxError, nodes
from jinja2.exceptions import SecurityError
from jinja2.ext import Extension, loopcontrols
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace
from jinja2.visitor import NodeTransformer
from markupsafe import Markup

from engine.chat_template_limits import (
    BOUNDED_FILTERS,
    MAX_INT_BITS,
    MAX_OUTPUT_CHARS,
    MAX_SOURCE_CHARS,
    MAX_VALUE_CHARS,
    RENDER_SECONDS,
    VALUE_TYPES,
    LimitedEscapeFormatter,
    LimitedFormatter,
    TemplateLimitError,
    bounded_concat,
    bounded_range,
    check_int,
    check_percent,
    check_result,
    check_size,
    checked_filter,
    checked_method_args,
    concat_parts,
    finalize,
    is_int,
    loop_steps,
    render_limits,
    spend,
    text_size,
    tick,
    too_large,
)
from engine.errors import ChatTemplateError, CorruptFileError, MissingFileError, ModelLoadError

log = logging.getLogger(__name__)

# Used when a model ships no template: ChatML is what most small instruct models were tuned on.
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- set content = message['content'] -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- elif content is iterable and content is not mapping -%}"
    # Only the text parts: image parts need model-specific placeholders, which a ChatML model has none of.
    "{%- for part in content if part is mapping and part['type'] == 'text' -%}{{ part['text'] }}{%- endfor -%}"
    "{%- endif -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

# Names a message's reasoning may arrive under; templates (Qwen3, gpt-oss) read the first two.
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


def find_chat_template(path: str | Path) -> str | None:
    """Return the chat template shipped with a model, or None when it has none.

    `path` is a Hugging Face model folder (looked up in `chat_template.jinja`, then `chat_template.json`,
    then the "chat_template" key of `tokenizer_config.json`) or a `.gguf` file (metadata key
    `tokenizer.chat_template`). Where a model lists several named templates, the one named "default" is
    used. Raises MissingFileError for a path that does not exist, CorruptFileError for unreadable files.
    """
    path = Path(path)
    if not path.exists():
        raise MissingFileError(f"{path} does not exist. Give a model folder or a .gguf file.")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelLoadError(f"{path} is neither a model folder nor a .gguf file; give one of those.")
        return _from_gguf(path)

    jinja_file = path / "chat_template.jinja"
    if jinja_file.is_file():
        template = _nonblank(_read_text(jinja_file))
        if template is not None:
            return template
    for name in ("chat_template.json", "tokenizer_config.json"):
        config_file = path / name
        if config_file.is_file():
            template = _pick_template(_read_json(config_file).get("chat_template"), config_file)
            if template is not None:
                return template
    return None


def _from_gguf(path: Path) -> str | None:
    # Imported here so that templates of HF folders never load the gguf package.
    from engine.gguf_file import GGUFFile

    value = GGUFFile.open(path).metadata.get("tokenizer.chat_template")
    if value is not None and not isinstance(value, str):
        raise CorruptFileError(f"{path}: tokenizer.chat_template is a {type(value).__name__}, not text.")
    return _nonblank(value)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CorruptFileError(f"{path} cannot be read as UTF-8 text ({e}); download the model again.") from None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(_read_text(path))
    except json.JSONDecodeError as e:
        raise CorruptFileError(f"{path} is not valid JSON ({e}); download the model again.") from None
    if not isinstance(data, dict):
        raise CorruptFileError(f"{path} should hold a JSON object, not a {type(data).__name__}.")
    return data


def _pick_template(value: Any, origin: Path | str) -> str | None:
    """A template from a config value: a string, a {name: template} dict or a [{name, template}] list."""
    if value is None or isinstance(value, str):
        return _nonblank(value)
    if isinstance(value, list):
        named: dict[str, Any] = {}
        for entry in value:
            if not (isinstance(entry, dict) and isinstance(entry.get("name"), str) and "template" in entry):
                raise CorruptFileError(
                    f"{origin}: a chat_template list entry should be {{'name': ..., 'template': ...}}, "
                    f"got {entry!r:.80}."
                )
            named[entry["name"]] = entry["template"]
        value = named
    if isinstance(value, dict):
        if not value:
            return None
        name = "default" if "default" in value else next(iter(value))
        if name != "default":
            log.warning("%s has no chat template named 'default'; using %r", origin, name)
        template = value[name]
        if template is not None and not isinstance(template, str):
            raise CorruptFileError(f"{origin}: chat template {name!r} is a {type(template).__name__}, not text.")
        return _nonblank(template)
    raise CorruptFileError(f"{origin}: chat_template is a {type(value).__name__}; expected text or a list.")


def _nonblank(template: str | None) -> str | None:
    # An empty template renders nothing at all, which is never what a model meant; treat it as missing.
    return template if template is not None and template.strip() else None


class ChatTemplate:
    """A model's chat template, compiled once, that turns a list of messages into prompt text.

    `source` is the Jinja text (None: fall back to ChatML). `bos_token`, `eos_token` and any other
    `**special` tokens (unk_token, pad_token, ...) are visible to the template under those names.
    Raises ChatTemplateError when the template has a syntax error. Rendering is bounded: see `render`.
    """

    def __init__(self, source: str | None, bos_token: str | None = None, eos_token: str | None = None, **special: Any):
        self._has_own = _nonblank(source) is not None
        self.source: str = source if self._has_own else CHATML_TEMPLATE
        tokens = {"bos_token": bos_token, "eos_token": eos_token, **special}
        # Unset tokens stay undefined (render as ""), as in transformers, rather than rendering "None".
        self.special_tokens: dict[str, Any] = {k: _plain(v) for k, v in tokens.items() if v is not None}
        try:
            self._template = _environment().from_string(self.source)
        except TemplateSyntaxError as e:
            raise ChatTemplateError(
                f"The chat template has a syntax error at line {e.lineno}: {e.message}. "
                "Fix the model's chat template or load the model without it."
            ) from e
        except TemplateLimitError as e:
            raise ChatTemplateError(str(e)) from e
        except Exception as e:  # anything else the compiler raises on untrusted text
            raise ChatTemplateError(f"The chat template cannot be compiled ({type(e).__name__}: {e}).") from e

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> ChatTemplate:
        """Build from an object with `chat_template`, `bos_token` and `eos_token` attributes."""
        source = _pick_template(getattr(tokenizer, "chat_template", None), type(tokenizer).__name__)
        extra = {}
        for name in ("unk_token", "pad_token"):
            value = getattr(tokenizer, name, None)
            if isinstance(value, str):
                extra[name] = value
        return cls(
            source,
            bos_token=_str_or_none(getattr(tokenizer, "bos_token", None)),
            eos_token=_str_or_none(getattr(tokenizer, "eos_token", None)),
            **extra,
        )

    @property
    def has_own_template(self) -> bool:
        """False when the model had no template and ChatML is used instead."""
        return self._has_own

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        """Render `messages` (dicts with "role" and "content") to the prompt text.

        Content is a string or a list of parts ({"type": "text", "text": ...}, {"type": "image"}).
        `tools` are JSON schemas, `documents` dicts; `extra` become template variables (e.g.
        enable_thinking). Raises ChatTemplateError for any failure inside the template, TypeError when
        messages, tools or documents are not lists of dicts.

        A render is bounded: past RENDER_SECONDS (2 s) of work, or past MAX_OUTPUT_CHARS (4 MB) of text, or
        when one step would build more than that (a huge format width, `'a' * 10**9`), it stops with a
        ChatTemplateError naming the limit. Normal templates take about a millisecond. The thread that calls
        this is busy until then: an app should render off its GUI thread.
        """
        context = {
            **self.special_tokens,
            **_plain(extra),
            "messages": _prepare_messages(messages),
            "tools": _plain(_dict_list(tools, "tools")),
            "documents": _plain(_dict_list(documents, "documents")),
            "add_generation_prompt": bool(add_generation_prompt),
        }
        try:
            with render_limits(RENDER_SECONDS):
                return self._template.render(context)
        except _TemplateRaised as e:
            raise ChatTemplateError(
                f"The chat template rejected the conversation: {e.message} "
                "(the model expects its messages in another order or shape)."
            ) from e
        except TemplateLimitError as e:
            raise ChatTemplateError(str(e)) from e
        except SecurityError as e:
            raise ChatTemplateError(
                f"The chat template did something its sandbox forbids and was stopped ({e}). "
                "Do not trust this model's template; use another model or replace the template."
            ) from e
        except Exception as e:  # TemplateError, UndefinedError, TypeError, RecursionError, ...
            raise ChatTemplateError(
                f"The chat template failed ({type(e).__name__}: {e}). Check that the messages have the "
                "roles and keys this model expects, or replace its template."
            ) from e


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else (None if value is None else str(value))


def _dict_list(items: Sequence[Mapping[str, Any]] | None, what: str) -> list[Mapping[str, Any]] | None:
    if items is None:
        return None
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Sequence):
        raise TypeError(f"{what} should be a list of dicts, got {type(items).__name__}.")
    for item in items:
        if not isinstance(item, Mapping):
            raise TypeError(f"each of the {what} should be a dict, got {type(item).__name__}: {item!r:.80}.")
    return list(items)


def _prepare_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    prepared = []
    for message in _dict_list(messages, "messages") or []:
        # Keys set to None (OpenAI-style content=None) are dropped: templates test for a missing key.
        plain = {k: v for k, v in _plain(message).items() if v is not None}
        reasoning = next((plain[k] for k in _REASONING_KEYS if k in plain), None)
        if reasoning is not None:
            plain = {"thinking": reasoning, **plain, "reasoning_content": reasoning}
        prepared.append(plain)
    return prepared


def _plain(value: Any) -> Any:
    """A copy of `value` made only of JSON-like types, so the template can neither mutate the caller's
    data nor call methods of rich objects (images, paths, tensors), which become "<TypeName>" text."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return f"<{type(value).__name__}>"


class _TemplateRaised(TemplateError):
    """What `raise_exception(message)` throws, told apart from Jinja's own errors."""


def _raise_exception(message: Any) -> None:
    raise _TemplateRaised(str(message))


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _SafeNamespace(Namespace):
    """`namespace(...)` that refuses underscore names, which could shadow Namespace's internals, and whose text
    does not show its attributes (so printing one costs nothing, however often its values are shared)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        # `self` is taken from args, as Namespace does, so a template may still pass `self=...` as a name.
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _SafeNamespace._check(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _SafeNamespace._check(name)
        Namespace.__setitem__(self, name, value)

    def __repr__(self) -> str:
        return "<Namespace>"

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"a chat template may not set the underscore attribute {name!r} on a namespace")


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; here it just renders."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


class _NoFiles(BaseLoader):
    """Refuses every `{% include %}`, `{% import %}` and `{% extends %}`: a template is one self-contained text."""

    def get_source(self, environment: Any, template: str) -> Any:
        raise TemplateNotFound(f"{template!r} (a chat template cannot load other templates or files)")


# Filters the rewrite below puts into templates. Filters are looked up when a template compiles, so a template
# cannot shadow them; calling one by name from a template does nothing it could not do anyway.
_LOOP_FILTER = "tandem_loop_steps"
_LITERAL_FILTER = "tandem_literal"
_CONCAT_FILTER = "tandem_concat"


class _CountWork(NodeTransformer):
    """Rewrites a parsed template so that its work is counted (engine/chat_template_limits.py): each `for`
    iterates through a filter that ticks per item, list/tuple/dict literals are size-checked (`[a, a]` shares
    one value twice, and nesting that doubles it), and `~` joins within the size limit."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = _filtered(node.iter, _LOOP_FILTER)
        return node

    def visit_List(self, node: nodes.List) -> nodes.Node:
        self.generic_visit(node)
        return _filtered(node, _LITERAL_FILTER)

    def visit_Dict(self, node: nodes.Dict) -> nodes.Node:
        self.generic_visit(node)
        return _filtered(node, _LITERAL_FILTER)

    def visit_Tuple(self, node: nodes.Tuple) -> nodes.Node:
        self.generic_visit(node)
        return _filtered(node, _LITERAL_FILTER) if node.ctx == "load" else node  # not `{% set a, b = ... %}`

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return _filtered(nodes.Tuple(node.nodes, "load", lineno=node.lineno), _CONCAT_FILTER)


def _filtered(node: nodes.Expr, name: str) -> nodes.Filter:
    return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)


class _Sandbox(ImmutableSandboxedEnvironment):
    """jinja2's immutable sandbox with every place compiled template code does work counted and bounded."""

    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})

    def __init__(self) -> None:
        super().__init__(
            loader=_NoFiles(),
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[_GenerationTag, loopcontrols],
            finalize=finalize,
        )
        self.concat = bounded_concat  # type: ignore[method-assign]
        filters = {**self.filters, **BOUNDED_FILTERS}
        self.filters = {name: checked_filter(name, func) for name, func in filters.items()}
        self.filters[_LOOP_FILTER] = loop_steps
        self.filters[_LITERAL_FILTER] = lambda value: check_size(value, "a list or dict of more than that")
        self.filters[_CONCAT_FILTER] = concat_parts
        self.globals.pop("lipsum", None)  # writes any amount of text in a Python loop; no chat template uses it
        self.globals["range"] = bounded_range
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = _strftime_now
        self.globals["namespace"] = _SafeNamespace

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        if len(source) > MAX_SOURCE_CHARS:
            raise TemplateLimitError(
                f"The chat template is {len(source)} characters long; a chat template may have at most "
                f"{MAX_SOURCE_CHARS}. Use another model, or fix its chat template."
            )
        return _CountWork().visit(super()._parse(source, name, filename))

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        tick()
        if operator == "+" and type(left) is str and type(right) is str:  # how most templates build a prompt
            if len(left) + len(right) > MAX_VALUE_CHARS:
                raise too_large("a string joined with + of more than that")
            spend(len(left) + len(right))
            return left + right
        if operator == "**" and is_int(left) and is_int(right) and abs(left) > 1:
            # The result has about right * bits(left) bits; past the bound it would take seconds or hang.
            if right * abs(left).bit_length() > MAX_INT_BITS:
                raise too_large(f"{left} ** {right}")
        elif operator == "*":
            for seq, count in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and is_int(count) and count > 1:
                    if text_size(seq, MAX_VALUE_CHARS // count + 1) * count > MAX_VALUE_CHARS:
                        raise too_large(f"a sequence repeated {count} times")
            if is_int(left) and is_int(right) and left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise too_large(f"a product of {left.bit_length() + right.bit_length()} bits")
        elif operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
            # len() first: it is a lower bound of the size, and free.
            if len(left) + len(right) > MAX_VALUE_CHARS or text_size(left) + text_size(right) > MAX_VALUE_CHARS:
                raise too_large("a string or list joined with + of more than that")
        elif operator == "%" and isinstance(left, str):
            check_percent(left, right)
        result = self.binop_table[operator](left, right)
        if type(result) is int:
            check_int(result, "a number")
        elif isinstance(result, (str, list, tuple)):
            spend(len(result))
        return result

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (jinja's names)
        tick()
        if not __self.is_safe_callable(__obj):
            raise SecurityError(f"{__obj!r} is not safely callable")
        if isinstance(__obj, LoopContext) and args:  # `loop(children)` in a recursive loop: its items are steps too
            args = (loop_steps(args[0]), *args[1:])
        owner = getattr(__obj, "__self__", None)
        if isinstance(__obj, (types.BuiltinMethodType, types.MethodType)) and isinstance(owner, VALUE_TYPES):
            args = checked_method_args(owner, __obj.__name__, args, kwargs)
        # Arguments may share one value many times (`f(x, x)`), and a macro's varargs hold them as a tuple.
        if text_size((args, kwargs)) > MAX_VALUE_CHARS:
            raise too_large("call arguments of more than that")
        return check_result(__context.call(__obj, *args, **kwargs), "a call's result")

    def getattr(self, obj: Any, attribute: str) -> Any:
        tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        tick()
        return super().getitem(obj, argument)

    def call_filter(self, *args: Any, **kwargs: Any) -> Any:  # map('upper'): once per item
        tick()
        return super().call_filter(*args, **kwargs)

    def call_test(self, *args: Any, **kwargs: Any) -> Any:  # select('odd'): once per item
        tick()
        return super().call_test(*args, **kwargs)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        # jinja's own, with a formatter that bounds widths and the total (jinja builds its formatter inline).
        if not isinstance(value, (types.MethodType, types.BuiltinMethodType)) or value.__name__ not in (
            "format",
            "format_map",
        ):
            return None
        f_self = value.__self__
        if not isinstance(f_self, str):
            return None
        str_type = type(f_self)
        is_format_map = value.__name__ == "format_map"

        def wrapper(*args: Any, **kwargs: Any) -> str:
            if is_format_map:
                if kwargs:
                    raise TypeError("format_map() takes no keyword arguments")
                if len(args) != 1:
                    raise TypeError(f"format_map() takes exactly one argument ({len(args)} given)")
                kwargs, args = args[0], ()
            if isinstance(f_self, Markup):
                formatter: LimitedFormatter = LimitedEscapeFormatter(self, escape=f_self.escape)
            else:
                formatter = LimitedFormatter(self)
            return str_type(formatter.vformat(f_self, args, kwargs))

        return functools.update_wrapper(wrapper, value)


_ENVIRONMENT: _Sandbox | None = None
_ENVIRONMENT_LOCK = threading.Lock()


def _environment() -> _Sandbox:
    # One shared environment: it holds no per-render state, and building it on first use keeps import cheap.
    global _ENVIRONMENT
    with _ENVIRONMENT_LOCK:
        if _ENVIRONMENT is None:
            _ENVIRONMENT = _Sandbox()
        return _ENVIRONMENT


__all__ = ["CHATML_TEMPLATE", "MAX_OUTPUT_CHARS", "RENDER_SECONDS", "ChatTemplate", "find_chat_template"]
