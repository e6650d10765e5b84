"""The string, number and URL rules of WebArena's evaluators, as pure functions.

Every rule compares *normalised* text: surrounding whitespace and one pair of matching
quotes stripped, case folded, runs of whitespace collapsed to one space (WebArena strips
quotes and lower-cases; collapsing whitespace also makes page text with line breaks
comparable). A reference may hold alternatives separated by ` |OR| `.

`includes(reference, text)`, the rule behind must_include, must_exclude and one_of,
decides by the shape of the reference (WebArena's plain substring test gives lucky passes
such as "0" inside "$10.00", and WebArena-Lite's NLTK tokens give false failures such as
"0." or "$0.00"; both are reported upstream):

- a number ("0", "778.2", "$1,000", "-5", "15%"): some number in the text has the same
  value. "0" matches "$0.00", "0." and "000"; it does not match "$10.00", "20" or "0.5".
  "170" matches the order number "000000170". A reference with decimals matches a
  number that agrees to that many decimals: "40.442" matches "40.4424191" (WebArena's
  coordinate references are truncated that way; "-79.939" matches "-79.9397388").
- one word without spaces ("a", "yes", "byteblaze", "n/a", "914km"): found with no word
  character right before or after it, so "a" is not found in "banana" and "yes" not in
  "yesterday", but "lgtm" is found in "LGTM!" and "byteblaze" in "@byteblaze".
- a phrase with spaces: a substring, as WebArena does ("virtual meetup" is found in
  "virtual meetups"), except that a number at its start or end must not be part of a
  longer number ("3 items" is not found in "13 items").

Where a number meets a word, a space is optional on both sides ("914km" == "914 km").

`exact_match` also ignores one trailing full stop on either side ("Sprite." == "sprite").

URLs (`url_matches`): the scheme is ignored, the host is compared without
case and without a default port, paths are percent-decoded and compared segment by segment
without a trailing slash. Under WebArena's default rule "GOLD in PRED" the reference path
must be a segment prefix of the page's path ("/f/books" matches "/f/books/12/a-post";
"/a/b" matches neither "/a/bc" nor the shorter "/a") and every query
value of the reference must be among the page's values for that key (extra keys allowed).
The fragment is ignored (as WebArena does). Under "EXACT" (WebArena-Lite's other rule) path,
query and fragment must all be equal (query order aside).
"""

from __future__ import annotations

import re
from decimal import ROUND_DOWN, Decimal
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = [
    "EXACT",
    "GOLD_IN_PRED",
    "alternatives",
    "exact_match",
    "includes",
    "normalize",
    "numbers",
    "parse_required_value",
    "required_value_holds",
    "url_matches",
]

GOLD_IN_PRED = "GOLD in PRED"
EXACT = "EXACT"

_OR = re.compile(r"\s+\|OR\|\s+")
_QUOTES = {'"': '"', "'": "'", "\u201c": "\u201d", "\u2018": "\u2019"}
# A number in running text: not glued to a word or a decimal point on its left, an
# optional sign (only when not glued to a word: "Short-32" holds 32, not -32), an optional
# currency sign, digits with optional thousands commas, an optional fraction.
_NUMBER = re.compile(
    r"(?<![\w.])(?:(?P<sign>-)(?=[$€£]?\d))?[$€£]?"
    r"(?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?P<frac>\.\d+)?(?!\d)"
)
_NUMERIC_REF = re.compile(r"^[-+]?[$€£]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?%?$")
_OPERATORS = ("<=", ">=", "==", "!=", "<", ">", "=")
# Where a number meets a word ("914km", "914 km", "3h 30min"): spacing there is free.
_UNIT_GAP = re.compile(r"(?<=\d) ?(?=[^\W\d_])|(?<=[^\W\d_]) ?(?=\d)")
_REQUIRED = re.compile(r"^(?P<op><=|>=|==|!=|<|>|=)?\s*(?P<num>[-+]?\d+(?:\.\d+)?)$")


def normalize(text: str) -> str:
    """Whitespace and one pair of surrounding quotes stripped, case folded, spaces collapsed."""
    s = text.strip()
    if len(s) >= 2 and s[0] in _QUOTES and s[-1] == _QUOTES[s[0]]:
        s = s[1:-1]
    return " ".join(s.split()).casefold()


def alternatives(reference: str) -> list[str]:
    """`"a |OR| b"` -> `["a", "b"]`; a reference without ` |OR| ` is its own only choice."""
    return [part for part in _OR.split(reference) if part.strip()] or [reference]


def exact_match(reference: str, text: str) -> bool:
    """Equal after normalisation, ignoring one trailing full stop on either side."""
    return normalize(reference).removesuffix(".") == normalize(text).removesuffix(".")


def _to_decimal(sign: str | None, integer: str, frac: str | None) -> Decimal:
    value = Decimal(integer.replace(",", "") + (frac or ""))
    return -value if sign == "-" else value


def numbers(text: str) -> list[Decimal]:
    """The numbers written in `text`, in order ("$1,200.50 and 3" -> [1200.50, 3])."""
    return [_to_decimal(m["sign"], m["int"], m["frac"]) for m in _NUMBER.finditer(text)]


def _numeric_reference(ref: str) -> Decimal | None:
    if not _NUMERIC_REF.match(ref):
        return None
    body = ref.rstrip("%").lstrip("+")
    sign = "-" if body.startswith("-") else None
    body = body.lstrip("-").lstrip("$€£")
    integer, _, frac = body.partition(".")
    return _to_decimal(sign, integer, "." + frac if frac else None)


def _same_number(reference: Decimal, value: Decimal) -> bool:
    """Equal, or equal to the reference's decimals when it has some (truncated)."""
    if value == reference:
        return True
    exponent = reference.as_tuple().exponent
    if not isinstance(exponent, int) or exponent >= 0:
        return False
    return value.quantize(Decimal(1).scaleb(exponent), rounding=ROUND_DOWN) == reference


def _pattern(ref: str) -> str:
    """The reference as a regex; a space between a number and a word is optional."""
    return r"\s*".join(re.escape(chunk) for chunk in _UNIT_GAP.split(ref))


def _includes_one(ref: str, text: str) -> bool:
    if not ref:
        return True
    value = _numeric_reference(ref)
    if value is not None:
        return any(_same_number(value, found) for found in numbers(text))
    # One word: no word character right before or after it. A phrase: a substring. A
    # number at either end must not be part of a longer number.
    word = " " not in _UNIT_GAP.sub("", ref)
    before = r"(?<!\w)" if word and re.match(r"\w", ref[0]) else ""
    after = r"(?!\w)" if word and re.match(r"\w", ref[-1]) else ""
    if ref[0].isdigit():
        before += r"(?<!\d)(?<!\d[.,])"
    if ref[-1].isdigit():
        after += r"(?![.,]?\d)"
    return re.search(before + _pattern(ref) + after, text) is not None


def includes(reference: str, text: str) -> bool:
    """Whether `text` contains `reference` (or one of its ` |OR| ` alternatives).

    Both sides are normalised; numbers, single words and phrases follow the rules in the
    module docstring.
    """
    haystack = normalize(text)
    return any(_includes_one(normalize(alt), haystack) for alt in alternatives(reference))


def parse_required_value(spec: str) -> list[tuple[str, Decimal]]:
    """`"< 700 |OR| == 0"` -> `[("<", 700), ("==", 0)]`; a bare number means `==`.

    Raises ValueError naming the part that is not `[op] number`.
    """
    out: list[tuple[str, Decimal]] = []
    for alt in alternatives(spec):
        match = _REQUIRED.match(alt.strip())
        if match is None:
            raise ValueError(
                f"{alt.strip()!r} is not a comparison like '< 700', '>= 3' or '42' "
                f"(operators: {' '.join(_OPERATORS)})"
            )
        op = match["op"] or "=="
        out.append(("==" if op == "=" else op, Decimal(match["num"])))
    return out


def _compare(value: Decimal, op: str, bound: Decimal) -> bool:
    match op:
        case "<":
            return value < bound
        case "<=":
            return value <= bound
        case ">":
            return value > bound
        case ">=":
            return value >= bound
        case "!=":
            return value != bound
        case _:
            return value == bound


def required_value_holds(spec: str, value: Decimal) -> bool:
    """Whether `value` satisfies one of the comparisons of `spec`."""
    return any(_compare(value, op, bound) for op, bound in parse_required_value(spec))


# --------------------------------------------------------------------------- URLs

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _url_parts(url: str) -> tuple[str, list[str], dict[str, list[str]], str]:
    """(host[:port], path segments, query, fragment) of a URL, normalised for comparison."""
    parts = urlsplit(url.strip())
    host = (parts.hostname or "").lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is not None and port != _DEFAULT_PORTS.get(parts.scheme.lower()):
        host = f"{host}:{port}"
    path = unquote(parts.path).strip("/")
    segments = path.split("/") if path else []
    query = parse_qs(parts.query, keep_blank_values=True)
    return host, segments, query, unquote(parts.fragment)


def _one_url_matches(reference: str, actual: str, rule: str) -> bool:
    ref_host, ref_path, ref_query, ref_fragment = _url_parts(reference)
    host, path, query, fragment = _url_parts(actual)
    if ref_host and ref_host != host:
        return False
    if rule == EXACT:
        return ref_path == path and _same_query(ref_query, query) and ref_fragment == fragment
    if path[: len(ref_path)] != ref_path:
        return False
    return all(set(values) <= set(query.get(key, [])) for key, values in ref_query.items())


def _same_query(a: dict[str, list[str]], b: dict[str, list[str]]) -> bool:
    return a.keys() == b.keys() and all(sorted(a[k]) == sorted(b[k]) for k in a)


def url_matches(reference: str, actual: str, *, rule: str = GOLD_IN_PRED) -> bool:
    """Whether the page URL `actual` matches `reference` (or one of its alternatives)."""
    if rule not in (GOLD_IN_PRED, EXACT):
        raise ValueError(f"unknown url_note {rule!r} (known: {GOLD_IN_PRED!r}, {EXACT!r})")
    return any(_one_url_matches(ref, actual, rule) for ref in alternatives(reference))
