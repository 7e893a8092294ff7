"""Recording rules written into the expressions that read them, as subqueries on the rules' grid.

A backtest used to backfill each recording rule into the TSDB with promtool (one pass per
level, the whole run through Prometheus's JSON API) before the alerts could read it. Almost all
of its time went there. On a 1 s grid a recorded series is exactly a subquery of its expression:

    R                 ->  last_over_time((E)[LOOKBACK:1s])   the sample a lookback would find
    R[20s]            ->  (E)[20s:1s]                        the samples a range would select
    R offset 5s       ->  last_over_time((E)[LOOKBACK:1s] offset 5s)
    R[30s] offset 5s  ->  (E)[30s:1s] offset 5s

where E is R's expression, itself inlined, and guarded to evaluate only from the grid's first
point on (a backfill records nothing before its start). A reader that sees R one evaluation
late (its group evaluates before R's, after the scrape: `lag`) reads it `offset 1s` further back.
Prometheus evaluates every subquery on whole seconds, which is why the backtest's grid is on
whole seconds. A name recorded by rules with `labels:` (alerts.yml's thresholds, one rule per
alert) is inlined where a reference picks exactly one of those rules by equality matchers on the
labels it sets:

    R{alertname="X"}  ->  last_over_time((label_replace(E, "alertname", "X", "", ""))[LOOKBACK:1s])

A reference this module cannot rewrite exactly (other matchers on R, `@`, a subquery of R)
leaves R backfilled as before; Prometheus evaluates everything either way.

Not a PromQL parser: it scans just enough (strings, comments, matchers, label lists, numbers)
to find metric names, and refuses the rewrite when in doubt.

    >>> inliner = Inliner({"r:x:avg5s": "avg_over_time(x[5s])"}, lookback="3s", since=0.0)
    >>> inliner.inline("r:x:avg5s > 3")
    'last_over_time((avg_over_time(x[5s]))[3s:1s]) > 3'
    >>> inliner.guarded("absent(x)")
    '(absent(x)) and on() (vector(time()) >= 0.0)'
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from runwatch.core.durations import duration_ms

_TOKEN = re.compile(
    r"""(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
      |(?P<comment>\#[^\n]*)
      |(?P<number>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?(?:ms|s|m|h|d|w|y)*)
      |(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)
      |(?P<space>\s+)
      |(?P<other>.)""",
    re.VERBOSE | re.DOTALL,
)
# keywords followed by a parenthesised list of label names, not of metrics
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
# names PromQL reads as operators, aggregations or literals, never as metrics
_KEYWORDS = _LABEL_LISTS | {
    "and", "or", "unless", "atan2", "offset", "bool", "inf", "nan", "sum", "min", "max", "avg", "group",
    "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile",
}  # fmt: skip
_DURATION = r"-?(?:\d+(?:ms|s|m|h|d|w|y))+"
_AFTER = re.compile(
    rf"(?:\s*\[\s*(?P<range>{_DURATION})\s*\])?(?:\s*offset\s+(?P<offset>{_DURATION}))?"
    r"(?P<rest>(?=\s*(?:[@\[{]|offset\b)))?"
)
# A selector's matchers, when every one is label="value" (the only ones a rule's `labels:` decide)
_MATCHERS = re.compile(r"\s*\{(?P<body>(?:[^{}\"]|\"(?:[^\"\\]|\\.)*\")*)\}")
_EQUALS = re.compile(r'\s*(?P<label>[a-zA-Z_]\w*)\s*=\s*"(?P<value>(?:[^"\\]|\\.)*)"\s*(?:,|$)')


# What can give an expression a value before the data's first sample: functions that make a
# series from no input (the date functions default to vector(time())), or reads from later times.
FROM_NOTHING = re.compile(
    r"\b(?:absent|absent_over_time|vector|time|scalar|pi|day_of_month|day_of_week|day_of_year|days_in_month"
    r"|hour|minute|month|year)\s*\(|@|offset\s+-"
)


@dataclass(frozen=True)
class Reference:
    """One place an expression names a metric: [start, end) of the text it rewrites."""

    name: str
    start: int
    end: int
    range: str | None  # "20s" in R[20s]
    offset: str | None  # "5s" in R offset 5s
    exact: bool  # False: a form this module does not rewrite (matchers, @, subquery)
    matchers: dict[str, str] | None = None  # {label: value} of a selector of equality matchers only


def _equality_matchers(body: str) -> dict[str, str] | None:
    """label="value", ... as a dict; None if any matcher is another kind (!=, =~, !~) or repeated."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(body.rstrip()):
        m = _EQUALS.match(body, pos)
        if m is None or m["label"] in out or "\\" in m["value"]:
            return None
        out[m["label"]] = m["value"]
        pos = m.end()
    return out or None


def references(expr: str) -> list[Reference]:
    """Every metric name the expression selects, with what follows it."""
    tokens = [(m.lastgroup, m.group(), m.start(), m.end()) for m in _TOKEN.finditer(expr)]
    out: list[Reference] = []
    braces = brackets = 0
    label_list = False  # inside by (...), on (...), ...
    expect_list = False
    for i, (kind, text, start, end) in enumerate(tokens):
        if kind in ("space", "comment"):
            continue
        if kind == "other":
            if text in "{}[]":
                braces += {"{": 1, "}": -1}.get(text, 0)
                brackets += {"[": 1, "]": -1}.get(text, 0)
            elif text == "(" and expect_list:
                label_list = True
            elif text == ")" and label_list:
                label_list = False
            expect_list = False
            continue
        if kind != "name" or braces > 0 or brackets > 0 or label_list:
            expect_list = False
            continue
        expect_list = text in _LABEL_LISTS
        following = next((t for t in tokens[i + 1 :] if t[0] not in ("space", "comment")), None)
        if text.lower() in _KEYWORDS or (following is not None and following[1] == "("):
            continue  # a keyword, a function or an aggregation
        matchers = None
        selector = _MATCHERS.match(expr, end)
        if selector is not None:
            matchers = _equality_matchers(selector["body"])
            m = _AFTER.match(expr, selector.end())
            if matchers is None or m["rest"] is not None:
                out.append(Reference(text, start, end, None, None, False))
                continue
            out.append(Reference(text, start, m.end(), m["range"], m["offset"], False, matchers))
            continue
        m = _AFTER.match(expr, end)
        exact = m["rest"] is None
        out.append(Reference(text, start, m.end() if exact else end, m["range"], m["offset"], exact))
    return out


class Inliner:
    """Rewrites expressions so that the named recording rules are evaluated in place.

    `rules` maps a recorded name to its expression; `lookback` is the query lookback delta and
    `since` the grid's first time (Unix seconds) before which nothing was recorded. `labelled`
    maps a name recorded by rules with `labels:` to each such rule's (labels, expression).
    """

    def __init__(
        self,
        rules: dict[str, str],
        lookback: str,
        since: float,
        labelled: dict[str, list[tuple[dict[str, str], str]]] | None = None,
        lag: Callable[[object, str], int] | None = None,
    ):
        self.rules, self.lookback, self.since = dict(rules), lookback, since
        self.labelled = {n: list(v) for n, v in (labelled or {}).items() if n not in self.rules}
        # lag(reader, name): grid steps (seconds) by which `reader` (the key given to inline(), or
        # the recorded name whose expression is inlined) sees recording `name` late
        self.lag = lag or (lambda reader, name: 0)
        self._done: dict[str, str] = {}

    def picked(self, ref: Reference) -> str | None:
        """The expression of the one labelled rule a reference selects, its labels set as the rule
        sets them; None unless its equality matchers name labels every candidate sets, and exactly
        one rule's labels agree (the others' series all differ on some matched label)."""
        rules = self.labelled.get(ref.name)
        if not rules or not ref.matchers:
            return None
        if any(k not in labels for labels, _ in rules for k in ref.matchers):
            return None
        [*match] = [(labels, e) for labels, e in rules if all(labels[k] == v for k, v in ref.matchers.items())]
        if len(match) != 1:
            return None
        labels, body = match[0]
        for k, v in sorted(labels.items()):
            body = f'label_replace({body}, "{k}", "{v}", "", "")'
        return body

    def inlinable(self, exprs: list[str], labelled: set[str] = frozenset()) -> set[str]:
        """The recorded names whose every reference, in `exprs` and in the rules, can be replaced.

        Left out, and so recorded as before: a name referenced in a form this module does not
        rewrite, a rule that adds `labels:`, a rule in a cycle, and every name as soon as some
        expression selects by `__name__` (it may select a recorded series by a pattern).
        """
        everything = [*exprs, *self.rules.values(), *(e for rules in self.labelled.values() for _, e in rules)]
        if any("__name__" in e for e in everything):
            return set()
        bad = set(labelled) - set(self.labelled)
        for e in everything:
            for r in references(e):
                if r.name in self.rules and not r.exact:
                    bad.add(r.name)
                elif r.name in self.labelled and self.picked(r) is None:
                    bad.add(r.name)
        names = set(self.rules) | set(self.labelled)
        cyclic = {n for n in names if self._cyclic(n)}
        return names - bad - cyclic

    def _reads(self, name: str) -> list[str]:
        exprs = [self.rules[name]] if name in self.rules else [e for _, e in self.labelled.get(name, [])]
        return [r.name for e in exprs for r in references(e) if r.name in self.rules or r.name in self.labelled]

    def _cyclic(self, name: str, seen: tuple[str, ...] = ()) -> bool:
        if name in seen:
            return True
        return any(self._cyclic(n, (*seen, name)) for n in self._reads(name))

    def guarded(self, expr: str) -> str:
        """expr, empty before the grid's first time: a backfill records nothing earlier.

        The guard costs a join per evaluation, so it is left out where it cannot change a thing:
        an expression without a function that makes series from nothing (`absent`, `vector`,
        `time`, ...), a negative offset or `@` reads only samples at or before its evaluation
        time, and there are none before the grid's first time.
        """
        if not FROM_NOTHING.search(expr):
            return expr
        return f"({expr}) and on() (vector(time()) >= {self.since!r})"

    def inline(self, expr: str, names: set[str] | None = None, reader: object = None) -> str:
        """expr with every reference to `names` (default: all rules) replaced by its subquery;
        `reader` says whose expression it is, for `lag`."""
        names = set(self.rules) | set(self.labelled) if names is None else names
        out, last = [], 0
        for ref in references(expr):
            if ref.name not in names:
                continue
            if ref.name in self.labelled:
                picked = self.picked(ref)
                if picked is None:
                    continue  # not inlinable() either: it is recorded
                body = self.guarded(self.inline(picked, names, reader=ref.name))
            elif ref.exact:
                body = self.guarded(self._expression(ref.name, names))
            else:
                continue
            offset = _offset(ref.offset, self.lag(reader, ref.name))
            if ref.range is not None:
                text = f"({body})[{ref.range}:1s]"
                if offset:
                    text += f" offset {offset}"
            else:
                text = f"({body})[{self.lookback}:1s]"
                if offset:
                    text += f" offset {offset}"
                text = f"last_over_time({text})"
            out += [expr[last : ref.start], text]
            last = ref.end
        return "".join(out) + expr[last:]

    def _expression(self, name: str, names: set[str]) -> str:
        key = f"{name}\0{sorted(names)}"
        if key not in self._done:
            self._done[key] = self.inline(self.rules[name], names, reader=name)
        return self._done[key]


def _offset(offset: str | None, lag: int) -> str | None:
    """A reference's offset, `lag` seconds further back: as written when there is no lag."""
    if not lag:
        return offset
    ms = duration_ms(offset, "offset") if offset else 0
    return f"{ms + 1000 * lag}ms"
