"""The action DSL parser: every advertised action parses; anything else is a ParseError."""

from __future__ import annotations

import re
import time
import warnings

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from policy.prompt import SYSTEM_PROMPT
from runtime.actions import (
    ACTION_NAMES,
    MAX_ANSWER_CHARS,
    MAX_COMPLETION_CHARS,
    format_action,
    parse_action,
    parse_completion,
    thought_of,
)
from runtime.base.messages import Action
from runtime.errors import ParseError


def test_every_action_the_system_prompt_advertises_parses() -> None:
    block = SYSTEM_PROMPT.split("ACTION is one of:")[1].split("\n\n")[0]
    lines = [line.strip() for line in block.strip().splitlines()]
    assert len(lines) == 15
    parsed = [parse_action(line.replace("ID", "7").replace("TAB_INDEX", "1")) for line in lines]
    names = {a.name for a in parsed if a.kind == "do"}
    assert names == set(ACTION_NAMES)
    assert {a.kind for a in parsed} == {"do", "go_backward", "go_forward", "exit"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '<think>the button</think><answer>do(action="Click", element="25")</answer>',
            Action(kind="do", name="Click", element=25),
        ),
        (
            '<answer>do(action="Click", element=25)</answer>',
            Action(kind="do", name="Click", element=25),
        ),
        (
            "<answer> do(action='Type', argument='blue shoes', element='3') </answer>",
            Action(kind="do", name="Type", argument="blue shoes", element=3),
        ),
        (
            '<answer>do(action="search", argument=42, element="3")</answer>',
            Action(kind="do", name="Search", argument="42", element=3),
        ),
        (
            '<answer>do(action="Select Dropdown Option", argument="Large", element="9")</answer>',
            Action(kind="do", name="Select Dropdown Option", argument="Large", element=9),
        ),
        (
            '<answer>do(action="Switch Tab", argument=1)</answer>',
            Action(kind="do", name="Switch Tab", argument="1"),
        ),
        (
            '<answer>do(action="Goto", argument="http://127.0.0.1:1/x")</answer>',
            Action(kind="do", name="Goto", argument="http://127.0.0.1:1/x"),
        ),
        ('<answer>do(action="Scroll  down")</answer>', Action(kind="do", name="Scroll Down")),
        ("<answer>go_forward()</answer>", Action(kind="go_forward")),
        ('<answer>exit(message="$12.50")</answer>', Action(kind="exit", message="$12.50")),
        (
            "<answer>exit('it is \"quoted\"')</answer>",
            Action(kind="exit", message='it is "quoted"'),
        ),
        ("<answer>exit(message=None)</answer>", Action(kind="exit", message="")),
        ("<answer>exit()</answer>", Action(kind="exit", message="")),
        ("<answer>exit(message=3.5)</answer>", Action(kind="exit", message="3.5")),
    ],
)
def test_valid_completions(text: str, expected: Action) -> None:
    assert parse_completion(text).action == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("do(action='Click', element='25')", "no <answer>"),
        ("<answer>do(action='Click', element='25')", "not closed"),
        ("<answer>go_backward()</answer><answer>go_forward()</answer>", "2 <answer> tags"),
        ("<answer></answer>", "empty"),
        ("<answer>do(action='Click')</answer>", 'needs element="ID"'),
        ("<answer>do(action='Click', element='x25')</answer>", "element id"),
        ("<answer>do(action='Click', element=-3)</answer>", "not a valid element id"),
        ("<answer>do(action='Click', element=True)</answer>", "literal"),
        ("<answer>do(action='Type', element=3)</answer>", 'needs argument="..."'),
        ("<answer>do(action='Fly', element=3)</answer>", "unknown action 'Fly'"),
        ("<answer>do(action='Click', element=3, force=1)</answer>", "unknown argument force="),
        ("<answer>do('Click', 3)</answer>", "keyword arguments only"),
        ("<answer>do(action=Click, element=3)</answer>", "literal"),
        ("<answer>do(action='Click', element=__import__('os'))</answer>", "literal"),
        ("<answer>do(**{'action': 'Click'})</answer>", "**arguments"),
        ("<answer>do(action='Click', action='Type')</answer>", "twice"),
        ("<answer>os.system('ls')</answer>", "not a call of do"),
        ("<answer>eval('1')</answer>", "unknown function"),
        ("<answer>go_backward(1)</answer>", "takes no arguments"),
        ("<answer>exit('a', 'b')</answer>", "one message"),
        ("<answer>do(action='Switch Tab', argument='second')</answer>", "tab index"),
        ("<answer>do(action='Goto', argument='  ')</answer>", "URL"),
        ("<answer>do(action='Click', element='1'))</answer>", "not a valid call"),
        ("<answer>" + "(" * 500 + "</answer>", "not a valid call"),
        ("<answer>" + "x" * (MAX_ANSWER_CHARS + 1) + "</answer>", "characters long"),
        ("<answer>do(action='Click', element='1')\x00</answer>", "not a valid call"),
        # ints Python will not write as text (over 4300 digits): a ParseError, not a ValueError
        (
            "<answer>do(action='Type', element=3, argument=0x" + "f" * 3900 + ")</answer>",
            "a number of 15600 bits",
        ),
        ("<answer>do(action='Click', element=-0x" + "f" * 3900 + ")</answer>", "write it as a"),
        ("<answer>exit(message=0x" + "f" * 3900 + ")</answer>", "write it as a string"),
        ("<answer>exit(" + "9" * 78 + ")</answer>", "a number of 260 bits"),
    ],
)
def test_invalid_completions_explain_themselves(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=re.escape(message)):
        parse_completion(text)


def test_the_longest_integer_literal_allowed_still_parses() -> None:
    action = parse_completion("<answer>exit(" + "9" * 77 + ")</answer>").action
    assert action == Action(kind="exit", message="9" * 77)


_FRAGMENTS = st.sampled_from(
    [
        "<think>",
        "</think>",
        "<answer>",
        "</answer>",
        "do(",
        "action=",
        "argument=",
        "element=",
        "exit(",
        "message=",
        "go_backward()",
        '"Click"',
        "'Type'",
        '"Select Dropdown Option"',
        '"25"',
        "25",
        "-1",
        "1e309",
        "0x10",
        "True",
        "None",
        "lambda: 0",
        "__import__('os')",
        "**{}",
        "*[]",
        "[",
        "]",
        "(",
        ")",
        ",",
        "=",
        '"',
        "'",
        '"""',
        "\\",
        "\n",
        "\x00",
        "é",
        "\ud7ff",
        "f'{1}'",
        "b'x'",
        "1j",
        "...",
        ":=",
        "#",
    ]
)
_ADVERSARIAL = st.lists(_FRAGMENTS | st.text(max_size=8), max_size=40).map("".join)


def _parse_or_error(text: str) -> Action | ParseError:
    try:
        return parse_completion(text).action
    except ParseError as exc:
        assert str(exc)
        return exc


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300) | _ADVERSARIAL)
def test_any_string_gives_an_action_or_a_parse_error(text: str) -> None:
    result = _parse_or_error(text)
    assert isinstance(result, Action | ParseError)
    if isinstance(result, Action):
        # What parsed formats back to text that parses to the same action.
        assert parse_action(format_action(result)) == result


@settings(max_examples=1500, deadline=None)
@given(_ADVERSARIAL)
def test_adversarial_answers_give_an_action_or_a_parse_error(inner: str) -> None:
    result = _parse_or_error(f"<think>t</think><answer>{inner}</answer>")
    assert isinstance(result, Action | ParseError)


_ACTIONS = st.one_of(
    st.builds(
        Action,
        kind=st.just("do"),
        name=st.sampled_from(["Click", "Right Click", "Hover"]),
        element=st.integers(0, 10**6),
    ),
    st.builds(
        Action,
        kind=st.just("do"),
        name=st.sampled_from(["Type", "Search", "Select Dropdown Option"]),
        argument=st.text(),
        element=st.integers(0, 10**6),
    ),
    st.builds(Action, kind=st.just("exit"), message=st.text()),
    st.sampled_from(
        [
            Action(kind="go_backward"),
            Action(kind="go_forward"),
            Action(kind="do", name="Scroll Down"),
            Action(kind="do", name="Press Enter"),
            Action(kind="do", name="Switch Tab", argument="2"),
        ]
    ),
)


@settings(max_examples=1000, deadline=None)
@given(_ACTIONS)
# Found by hypothesis in a clean clone: written literally, "</answer>" ended the answer.
@example(Action(kind="exit", message="</answer>"))
@example(Action(kind="do", name="Type", argument="\\</answer><answer>", element=1))
def test_format_then_parse_is_the_identity(action: Action) -> None:
    text = format_action(action)
    if len(text) <= MAX_ANSWER_CHARS:
        assert parse_action(text) == action
        assert parse_completion(f"<think>x</think><answer>{text}</answer>").action == action


# Escapes a model can write inside a string literal, lone surrogates among them, and the
# raw characters themselves.
_ESCAPES = st.sampled_from(
    ["\\ud800", "\\udfff", "\\ud83d", "\\ude00", "\\U0001f600", "\\x00", "\\N{BULLET}", "\ud800"]
)
_STRING_BODY = st.lists(_ESCAPES | st.text(max_size=4), max_size=6).map("".join)
_CALLS = st.one_of(
    _STRING_BODY.map(lambda b: f'exit(message="{b}")'),
    _STRING_BODY.map(lambda b: f'do(action="Type", argument="{b}", element="3")'),
    _STRING_BODY.map(lambda b: f'do(action="Goto", argument="{b}")'),
    _STRING_BODY.map(lambda b: f'do(action="Select Dropdown Option", argument="{b}", element=1)'),
    _ADVERSARIAL,
)
_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(Action)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(thought=_STRING_BODY, call=_CALLS)
def test_every_parsed_action_round_trips_through_msgspec_json(thought: str, call: str) -> None:
    result = _parse_or_error(f"<think>{thought}</think><answer>{call}</answer>")
    if isinstance(result, Action):
        assert _DECODER.decode(_ENCODER.encode(result)) == result
    # The thought is stored with the turn whether the action parsed or not.
    _ENCODER.encode(thought_of(f"<think>{thought}</think>"))


@pytest.mark.parametrize(
    "answer",
    [
        'exit(message="\\ud800")',
        'exit("a\\udfffb")',
        'do(action="Type", argument="\\ud83d", element="2")',
        'do(action="\\ud800Click", element="2")',
    ],
)
def test_a_lone_surrogate_escape_is_a_parse_error(answer: str) -> None:
    with pytest.raises(ParseError, match="lone surrogate"):
        parse_action(answer)


def test_a_surrogate_pair_escape_is_text() -> None:
    action = parse_action('exit(message="\\ud83d\\ude00 ok")')
    assert action.message == "\U0001f600 ok"


def test_a_thought_with_a_lone_surrogate_is_stored_with_a_replacement() -> None:
    completion = parse_completion("<think>a\ud800b</think><answer>go_forward()</answer>")
    assert completion.thought == "a\ufffdb"
    _ENCODER.encode(completion.thought)


@pytest.mark.parametrize(
    "unit",
    ["<answer>", "<think>", "<think><answer>", "<answer>x</answer>", "<answer>" + "x" * 9],
)
def test_hostile_completions_parse_in_linear_time(unit: str) -> None:
    """The old lazy tag regexes took 9 s at 128 KB and over 120 s at 512 KB."""
    just_under = unit * ((MAX_COMPLETION_CHARS - 1) // len(unit))
    one_mb = unit * (1_000_000 // len(unit))
    for text in (just_under, one_mb):
        started = time.perf_counter()
        result = _parse_or_error(text)
        thought_of(text)
        elapsed = time.perf_counter() - started
        assert elapsed < 0.5, (unit, len(text), elapsed)
        assert isinstance(result, ParseError)
    assert "the limit is" in str(_parse_or_error(one_mb))


def test_a_reply_python_warns_about_warns_no_one() -> None:
    """`1if` and `0x1for` make Python's parser warn (SyntaxWarning, printed on stderr over
    the live table in a daemon; an error under this suite's filter). Neither is a literal
    call: both are parse errors, and nothing is warned."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ParseError, match="element= must be a string or number literal"):
            parse_action('do(action="Click", element=1if 1 else 2)')
        with pytest.raises(ParseError, match="not a valid call"):
            parse_action('do(action="Click", element=0x1for)')
    assert caught == []
