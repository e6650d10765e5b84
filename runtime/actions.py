"""The action DSL: parse a completion into an `Action`, and format one back.

A completion is `<think>...</think><answer>ACTION</answer>` (policy.prompt.SYSTEM_PROMPT).
ACTION is one call, parsed with `ast` (literals only, never evaluated):

    do(action="Click", element="25")        Click, Right Click, Hover
    do(action="Type", argument="shoes", element=7)     Type, Search, Select Dropdown Option
    do(action="Scroll Up") / do(action="Scroll Down") / do(action="Press Enter") / do(action="Wait")
    do(action="Switch Tab", argument="1")   do(action="Goto", argument="http://...")
    go_backward()   go_forward()   exit(message="the answer")

Element ids may be given as "25" or 25. Anything else raises `ParseError` with a message
the model reads in its next observation. Executing actions on a page is
`runtime.session.BrowserSession.execute`.

Whatever a model writes, parsing costs time linear in the reply (tags are found with
`str.find`, never a backtracking regex; a reply over `MAX_COMPLETION_CHARS` is refused
before any scan) and what it accepts can always be encoded to JSON and stored: a string
literal with a lone surrogate escape (`"\\ud800"`) is a `ParseError`, and a thought with
one gets U+FFFD in its place.
"""

from __future__ import annotations

import ast
import warnings
from dataclasses import dataclass
from typing import Final

from runtime.base.messages import Action
from runtime.base.text import shorten, well_formed
from runtime.errors import ParseError

__all__ = [
    "ACTION_NAMES",
    "MAX_ANSWER_CHARS",
    "MAX_COMPLETION_CHARS",
    "MAX_INT_BITS",
    "Completion",
    "format_action",
    "parse_action",
    "parse_completion",
    "shorten",
    "thought_of",
]

# The DSL's action names, and which arguments each one needs.
_NEEDS: Final[dict[str, tuple[bool, bool]]] = {
    # name: (needs element, needs argument)
    "Click": (True, False),
    "Right Click": (True, False),
    "Hover": (True, False),
    "Type": (True, True),
    "Search": (True, True),
    "Select Dropdown Option": (True, True),
    "Scroll Up": (False, False),
    "Scroll Down": (False, False),
    "Press Enter": (False, False),
    "Wait": (False, False),
    "Switch Tab": (False, True),
    "Goto": (False, True),
}
ACTION_NAMES: Final[tuple[str, ...]] = tuple(_NEEDS)
_BY_LOWER: Final[dict[str, str]] = {name.lower(): name for name in _NEEDS}

# Longer answers are refused before `ast` sees them (parsing cost stays bounded).
MAX_ANSWER_CHARS: Final = 4000
# Longer replies are refused before any scan (a 2048-token reply is far shorter).
MAX_COMPLETION_CHARS: Final = 200_000
# Larger integer literals are refused: Python will not write an int of more than 4300
# digits as text (a ValueError, not a ParseError), and a hex literal within
# MAX_ANSWER_CHARS can be one. 256 bits is 77 digits, more than any id or typed number.
MAX_INT_BITS: Final = 256

# A literal argument value of the DSL.
_Value = str | int | float | None

_USAGE = 'expected one of do(action="...", ...), go_backward(), go_forward(), exit(message="...")'


@dataclass(frozen=True, slots=True)
class Completion:
    """A completion split into its thought and its parsed action."""

    thought: str
    action: Action


def thought_of(text: str) -> str:
    """The text of the first `<think>` span, stripped ("" when there is none).

    Lone surrogates (which JSON cannot carry) become U+FFFD; only the first
    `MAX_COMPLETION_CHARS` characters are looked at.
    """
    spans = _spans(text[:MAX_COMPLETION_CHARS], "<think>", "</think>", limit=1)
    return well_formed(spans[0].strip()) if spans else ""


def parse_completion(text: str) -> Completion:
    """The thought and the action of a completion; raises `ParseError` if there is none."""
    if len(text) > MAX_COMPLETION_CHARS:
        raise ParseError(
            f"the reply is {len(text)} characters long; the limit is {MAX_COMPLETION_CHARS}"
        )
    answers = _spans(text, "<answer>", "</answer>")
    if not answers:
        if "<answer>" in text:
            raise ParseError("the <answer> tag is not closed with </answer>")
        raise ParseError("no <answer>...</answer> in the reply; " + _USAGE)
    if len(answers) > 1:
        raise ParseError(f"{len(answers)} <answer> tags in the reply; give exactly one action")
    return Completion(thought_of(text), parse_action(answers[0]))


def _spans(text: str, open_tag: str, close_tag: str, *, limit: int = 0) -> list[str]:
    """What `re.findall(open(.*?)close, DOTALL)` gives, in time linear in `text`.

    Each search starts where the previous one ended, so no character is scanned twice per
    tag; once an opening tag has no closing one after it, no later one can have either.
    `limit` > 0 stops after that many spans.
    """
    spans: list[str] = []
    pos = 0
    while not limit or len(spans) < limit:
        start = text.find(open_tag, pos)
        if start < 0:
            break
        start += len(open_tag)
        end = text.find(close_tag, start)
        if end < 0:
            break
        spans.append(text[start:end])
        pos = end + len(close_tag)
    return spans


def parse_action(source: str) -> Action:
    """One action from the text between `<answer>` and `</answer>`."""
    source = source.strip()
    if not source:
        raise ParseError("the answer is empty; " + _USAGE)
    if len(source) > MAX_ANSWER_CHARS:
        raise ParseError(f"the answer is {len(source)} characters long; the limit is 4000")
    try:
        # A model writes "1if" too: Python's SyntaxWarning would go to stderr (over the
        # live table) for every such reply; what the tree holds is judged below.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ParseError(f"the answer is not a valid call: {shorten(source)}; {_USAGE}") from exc
    call = tree.body
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        raise ParseError(
            f"the answer is not a call of do, exit, go_backward or go_forward; {_USAGE}"
        )
    func = call.func.id
    args = [_literal(arg, func, "a positional argument") for arg in call.args]
    kwargs: dict[str, _Value] = {}
    for keyword in call.keywords:
        if keyword.arg is None:
            raise ParseError(f"{func}() does not take **arguments")
        if keyword.arg in kwargs:
            raise ParseError(f"{func}() got {keyword.arg}= twice")
        kwargs[keyword.arg] = _literal(keyword.value, func, f"{keyword.arg}=")
    match func:
        case "do":
            return _parse_do(args, kwargs)
        case "exit":
            return _parse_exit(args, kwargs)
        case "go_backward" | "go_forward":
            if args or kwargs:
                raise ParseError(f"{func}() takes no arguments")
            return Action(kind=func)
        case _:
            raise ParseError(f"unknown function {shorten(func)}(); {_USAGE}")


def _parse_do(args: list[_Value], kwargs: dict[str, _Value]) -> Action:
    if args:
        raise ParseError('do() takes keyword arguments only: do(action="...", ...)')
    unknown = sorted(set(kwargs) - {"action", "argument", "element"})
    if unknown:
        raise ParseError(f"do() got an unknown argument {unknown[0]}=")
    raw_name = kwargs.get("action")
    if not isinstance(raw_name, str):
        raise ParseError('do() needs action="..." naming the action as a string')
    name = _BY_LOWER.get(" ".join(raw_name.split()).lower())
    if name is None:
        known = ", ".join(ACTION_NAMES)
        raise ParseError(f"unknown action {shorten(raw_name)!r}; the actions are {known}")
    needs_element, needs_argument = _NEEDS[name]
    element = _element(kwargs.get("element"), name) if needs_element else None
    argument: str | None = None
    if needs_argument:
        raw = kwargs.get("argument")
        if raw is None:
            raise ParseError(f'{name} needs argument="..."')
        if isinstance(raw, float) and not raw.is_integer():
            argument = repr(raw)
        else:
            argument = str(int(raw)) if isinstance(raw, float) else str(raw)
        if name == "Switch Tab":
            argument = str(_index(argument))
        elif name == "Goto" and not argument.strip():
            raise ParseError("Goto needs a URL as its argument")
    return Action(kind="do", name=name, argument=argument, element=element)


def _parse_exit(args: list[_Value], kwargs: dict[str, _Value]) -> Action:
    unknown = sorted(set(kwargs) - {"message"})
    if unknown:
        raise ParseError(f"exit() got an unknown argument {unknown[0]}=")
    if len(args) > 1 or (args and "message" in kwargs):
        raise ParseError('exit() takes one message: exit(message="...")')
    raw = args[0] if args else kwargs.get("message", "")
    message = "" if raw is None else str(raw)
    return Action(kind="exit", message=message)


def _literal(node: ast.expr, func: str, where: str) -> _Value:
    """A string, number or None literal; anything else (names, calls, ...) is refused."""
    negative = False
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        negative, node = True, node.operand
    if isinstance(node, ast.Constant):
        value = node.value
        if value is None and not negative:
            return None
        if isinstance(value, str) and not negative:
            return _text_literal(value, func, where)
        if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            raise ParseError(
                f"{func}(): {where} is a number of {value.bit_length()} bits, longer than "
                f"{MAX_INT_BITS}; write it as a string"
            )
        if isinstance(value, int | float) and not isinstance(value, bool):
            return -value if negative else value
    raise ParseError(f"{func}(): {where} must be a string or number literal")


def _text_literal(value: str, func: str, where: str) -> str:
    """`value` as storable text: surrogate pairs written as two escapes ("\\ud83d\\ude00",
    as JSON spells them) become their character; a lone surrogate is a `ParseError`."""
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        pass
    try:
        return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    except UnicodeDecodeError:
        lone = next(c for c in value if 0xD800 <= ord(c) <= 0xDFFF)
        raise ParseError(
            f"{func}(): {where} holds a lone surrogate \\u{ord(lone):04x}, which is not text; "
            "write the character itself"
        ) from None


def _element(raw: object, name: str) -> int:
    if raw is None:
        raise ParseError(f'{name} needs element="ID" (an element id from the page)')
    if isinstance(raw, int):
        value = raw
    elif isinstance(raw, float) and raw.is_integer():
        value = int(raw)
    elif isinstance(raw, str) and raw.strip().isdecimal() and raw.strip().isascii():
        value = int(raw.strip())
    else:
        raise ParseError(f'element must be an element id like "25", not {shorten(str(raw))!r}')
    if value < 0 or value >= 10**9:
        raise ParseError(f"element {value} is not a valid element id")
    return value


def _index(argument: str) -> int:
    text = argument.strip()
    if not (text.isdecimal() and text.isascii()) or len(text) > 6:
        raise ParseError(f'Switch Tab needs a tab index like argument="1", not {shorten(text)!r}')
    return int(text)


def format_action(action: Action) -> str:
    """The DSL text of an action; `parse_action(format_action(a)) == a`."""
    match action.kind:
        case "exit":
            return f"exit(message={_quote(action.message or '')})"
        case "go_backward" | "go_forward":
            return f"{action.kind}()"
        case _:
            parts = [f"action={_quote(action.name)}"]
            if action.argument is not None:
                parts.append(f"argument={_quote(action.argument)}")
            if action.element is not None:
                parts.append(f'element="{action.element}"')
            return f"do({', '.join(parts)})"


def _quote(text: str) -> str:
    """A double-quoted Python string literal of `text`, with "</answer>" written
    "\\x3c/answer>" (literally, it would end the answer that holds the literal)."""
    body = repr(text)
    if body.startswith("'"):
        inner = body[1:-1].replace('"', '\\"').replace("\\'", "'")
        body = f'"{inner}"'
    return body.replace("</answer>", "\\x3c/answer>")
