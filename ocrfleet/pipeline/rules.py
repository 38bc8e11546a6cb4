"""Business rules: named checks on recognised text that send what fails to review.

A rules file (TOML, `OCRFLEET_RULES`) holds one table per rule:

    [rules.receipt_date]
    on = "document"              # "region": each region's text; "document": the whole text
    check = "date"               # regex | date | amount | luhn | field
    find = '(\\d{2}/\\d{2}/\\d{4})'  # where the value is (group 1, else the whole match)
    formats = ["%d/%m/%Y"]
    required = true              # finding no value at all is a failure too

    [rules.total]
    on = "document"
    check = "field"
    label = '(?i)\\btotal\\b'     # the label, followed by an amount ...
    within = 200                 # ... in the next 200 characters (default 40)

Checks: `regex` (`pattern` must match, or with `must_match = false` must not), `date`
(each value parses with one of `formats`), `amount` (each value matches `format`, by default
1,234.56 or 1234.56), `luhn` (each value's digits pass the Luhn checksum), `field` (`label`
followed within `within` characters by a value matching `value`, by default an amount: OCR
reading order often puts a receipt's amounts a few lines after their labels). A region rule
may name a `category`. The file's sha256 enters run_id: other rules, other run.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

CHECKS = ("regex", "date", "amount", "luhn", "field")
AMOUNT = r"\d{1,3}(?:,\d{3})+\.\d{2}|\d+\.\d{2}"
DEFAULT_FIND = {
    "date": r"\b\d{1,4}[/.-]\d{1,2}[/.-]\d{1,4}\b",
    "amount": r"\d[\d,.]*",
    "luhn": r"\b(?:\d[ -]?){12,18}\d\b",
}
DEFAULT_FORMATS = ("%d/%m/%Y", "%d-%m-%Y", "%d.%m.%Y", "%Y-%m-%d", "%d/%m/%y")
MAX_DETAIL = 200
NOT_FOUND = -1  # offset of a failure that points at no text (a required value is missing)


class RulesError(ValueError):
    """The rules file cannot be used; the message says which rule and why."""


@dataclass(frozen=True)
class Rule:
    name: str
    on: str
    check: str
    find: re.Pattern[str] | None = None
    pattern: re.Pattern[str] | None = None
    must_match: bool = True
    formats: tuple[str, ...] = DEFAULT_FORMATS
    amount: re.Pattern[str] = re.compile(AMOUNT)
    label: re.Pattern[str] | None = None
    within: int = 40
    required: bool = False
    category: str | None = None

    @property
    def reason(self) -> str:
        return f"rule:{self.name}"[:64]


@dataclass(frozen=True)
class Failure:
    """One offending value: where it starts in the checked text (NOT_FOUND: nowhere)."""

    rule: Rule
    offset: int
    text: str


@dataclass(frozen=True)
class RuleSet:
    rules: tuple[Rule, ...]
    sha256: str

    def on(self, scope: str) -> list[Rule]:
        return [rule for rule in self.rules if rule.on == scope]


def _regex(name: str, key: str, value: Any) -> re.Pattern[str]:
    if not isinstance(value, str):
        raise RulesError(f"rule {name}: {key} must be a string regex")
    try:
        return re.compile(value)
    except re.error as error:
        raise RulesError(f"rule {name}: {key} is not a valid regex: {error}") from None


def _rule(name: str, table: Any) -> Rule:
    if not isinstance(table, dict):
        raise RulesError(f"rule {name}: expected a table")
    known = {"on", "check", "find", "pattern", "must_match", "formats", "format", "label",
             "value", "within", "required", "category"}  # fmt: skip
    if unknown := sorted(set(table) - known):
        raise RulesError(f"rule {name}: unknown keys {unknown}")
    on = table.get("on", "region")
    if on not in ("region", "document"):
        raise RulesError(f"rule {name}: on must be 'region' or 'document', not {on!r}")
    check = table.get("check")
    if check not in CHECKS:
        raise RulesError(f"rule {name}: check must be one of {CHECKS}, not {check!r}")
    fields: dict[str, Any] = {"name": name, "on": on, "check": check}
    if "find" in table or check in DEFAULT_FIND:
        fields["find"] = _regex(name, "find", table.get("find", DEFAULT_FIND.get(check)))
    if check == "regex":
        fields["pattern"] = _regex(name, "pattern", table.get("pattern"))
        fields["must_match"] = bool(table.get("must_match", True))
    if check == "date":
        formats = table.get("formats", list(DEFAULT_FORMATS))
        if not formats or not all(isinstance(f, str) for f in formats):
            raise RulesError(f"rule {name}: formats must be a list of strptime formats")
        fields["formats"] = tuple(formats)
    if check == "amount" and "format" in table:
        fields["amount"] = _regex(name, "format", table["format"])
    if check == "field":
        fields["label"] = _regex(name, "label", table.get("label"))
        if "value" in table:
            fields["amount"] = _regex(name, "value", table["value"])
        within = table.get("within", 40)
        if not isinstance(within, int) or within < 1:
            raise RulesError(f"rule {name}: within must be a positive number of characters")
        fields["within"] = within
    fields["required"] = bool(table.get("required", check == "field"))
    if (category := table.get("category")) is not None:
        if on != "region" or category not in ("text", "formula", "table"):
            raise RulesError(f"rule {name}: category is text, formula or table, on regions")
        fields["category"] = category
    return Rule(**fields)


def load_rules(path: Path | str) -> RuleSet:
    """Parse and validate a rules file; every problem is a RulesError naming the rule."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise RulesError(f"cannot read the rules file {path}: {error.strerror}") from None
    try:
        document = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise RulesError(f"{path} is not valid TOML: {error}") from None
    tables = document.get("rules")
    if not isinstance(tables, dict) or not tables:
        raise RulesError(f"{path} has no [rules.NAME] tables")
    rules = tuple(_rule(name, table) for name, table in tables.items())
    return RuleSet(rules=rules, sha256=hashlib.sha256(data).hexdigest())


def rules_sha256(path: Path | str) -> str:
    """The file's hash for run_id; validates the file too, so a bad one fails early."""
    return load_rules(path).sha256


def luhn_ok(digits: str) -> bool:
    numbers = [int(d) for d in digits if d.isdigit()]
    if len(numbers) < 2:
        return False
    total = 0
    for position, number in enumerate(reversed(numbers)):
        if position % 2 == 1:
            number *= 2
            if number > 9:
                number -= 9
        total += number
    return total % 10 == 0


def _date_ok(value: str, formats: Sequence[str]) -> bool:
    for fmt in formats:
        try:
            datetime.strptime(value, fmt)
        except ValueError:
            continue
        return True
    return False


def _values(rule: Rule, text: str) -> list[tuple[int, str]]:
    assert rule.find is not None
    found = []
    for match in rule.find.finditer(text):
        group = 1 if match.re.groups else 0
        if match.group(group) is not None:
            found.append((match.start(group), match.group(group)))
    return found


def check(rule: Rule, text: str) -> list[Failure]:
    """The rule's failures on `text`; none means it passes."""
    failures: list[Failure] = []
    if rule.check == "regex":
        assert rule.pattern is not None
        targets = _values(rule, text) if rule.find is not None else [(0, text)]
        for offset, value in targets:
            match = rule.pattern.search(value)
            if rule.must_match and match is None:
                failures.append(Failure(rule, offset, value))
            elif not rule.must_match and match is not None:
                failures.append(Failure(rule, offset + match.start(), match.group(0)))
        if rule.required and not targets:
            failures.append(Failure(rule, NOT_FOUND, "nothing to check found"))
        return failures
    if rule.check == "field":
        assert rule.label is not None
        labels = list(rule.label.finditer(text))
        value = re.compile(rf"(?<![\w.,])(?:{rule.amount.pattern})(?![\w,]|\.\d)")
        for label in labels:
            if value.search(text, label.end(), label.end() + rule.within):
                return []
        if labels:
            last = labels[-1]
            shown = text[last.start() : last.end() + 40].split("\n\n")[0]
            return [Failure(rule, last.start(), shown)]
        return [Failure(rule, NOT_FOUND, f"no {rule.label.pattern} found")]
    values = _values(rule, text)
    for offset, value in values:
        ok = (
            _date_ok(value, rule.formats)
            if rule.check == "date"
            else rule.amount.fullmatch(value) is not None
            if rule.check == "amount"
            else luhn_ok(value)
        )
        if not ok:
            failures.append(Failure(rule, offset, value))
    if rule.required and not values:
        failures.append(Failure(rule, NOT_FOUND, f"no {rule.check} found"))
    return failures


def detail(failures: Sequence[Failure]) -> str:
    """The offending text of a flag: every failing value, in order."""
    return " | ".join(failure.text for failure in failures)[:MAX_DETAIL]
