"""The rules engine on text: each check passes what it should and names what fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from ocrfleet.config import Settings
from ocrfleet.pipeline.rules import NOT_FOUND, RulesError, check, load_rules, luhn_ok
from ocrfleet.runs import run_config, run_id_of

RULES = """
[rules.date]
on = "document"
check = "date"
find = '(?i)\\bdate\\b\\s*:?\\s*(\\S+)'
formats = ["%d/%m/%Y", "%d-%m-%Y"]
required = true

[rules.total]
on = "document"
check = "field"
label = '(?i)\\btotal\\b'

[rules.no_placeholder]
check = "regex"
pattern = '\\?\\?'
must_match = false

[rules.card]
check = "luhn"
category = "text"

[rules.price]
check = "amount"
find = 'RM\\s*(\\S+)'
"""


@pytest.fixture
def rules(tmp_path: Path) -> dict:
    path = tmp_path / "rules.toml"
    path.write_text(RULES)
    return {rule.name: rule for rule in load_rules(path).rules}


def failing(rule, text: str) -> list[tuple[int, str]]:
    return [(f.offset, f.text) for f in check(rule, text)]


def test_date(rules: dict) -> None:
    assert failing(rules["date"], "SHOP\nDate: 19/10/2018\nTOTAL 60.30") == []
    assert failing(rules["date"], "SHOP\nDate: 19-10-2018 10:22") == []
    text = "SHOP\nDate: 31/02/2018"
    assert failing(rules["date"], text) == [(text.index("31/02"), "31/02/2018")]
    assert failing(rules["date"], "no dates here") == [(NOT_FOUND, "no date found")]


def test_total_field(rules: dict) -> None:
    assert failing(rules["total"], "ITEM 1.00\nTOTAL: RM 60.30") == []
    assert failing(rules["total"], "ITEM 1.00\nTotal\n60.30") == []  # the value on the next line
    assert failing(rules["total"], "TOTAL\nCASH\nCHANGE\n" + "x" * 40 + "\n60.30") != []
    assert failing(rules["total"], "ITEM 1.00\nSUB TOTAL 1,060.30") == []
    [(offset, shown)] = failing(rules["total"], "ITEM 1.00\nTOTAL 60,3O")
    assert offset == len("ITEM 1.00\n") and shown.startswith("TOTAL 60,3O")
    assert failing(rules["total"], "ITEM 1.00") == [(NOT_FOUND, "no (?i)\\btotal\\b found")]


def test_regex_must_not_match(rules: dict) -> None:
    assert failing(rules["no_placeholder"], "fine text") == []
    assert failing(rules["no_placeholder"], "bad ?? text") == [(4, "??")]


def test_luhn(rules: dict) -> None:
    assert luhn_ok("4111 1111 1111 1111") and not luhn_ok("4111 1111 1111 1112")
    assert failing(rules["card"], "card 4111 1111 1111 1111 ok") == []
    assert failing(rules["card"], "card 4111-1111-1111-1112") == [(5, "4111-1111-1111-1112")]
    assert rules["card"].category == "text" and rules["card"].on == "region"


def test_amount(rules: dict) -> None:
    assert failing(rules["price"], "RM 12.50") == []
    assert failing(rules["price"], "RM 1,234.50") == []
    assert failing(rules["price"], "RM 12,50") == [(3, "12,50")]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not toml = = =", "not valid TOML"),
        ("[other]\nx = 1", "no [rules.NAME]"),
        ('[rules.a]\ncheck = "spell"', "check must be one of"),
        ('[rules.a]\ncheck = "regex"\npattern = "("', "rule a: pattern is not a valid regex"),
        ('[rules.a]\ncheck = "date"\nwhen = "x"', "rule a: unknown keys ['when']"),
        ('[rules.a]\non = "page"\ncheck = "date"', "on must be 'region' or 'document'"),
    ],
)
def test_bad_rules_files_are_refused_by_name(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(text)
    with pytest.raises(RulesError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_rules(path)
    with pytest.raises(RulesError, match="cannot read"):
        load_rules(tmp_path / "missing.toml")


def test_the_rules_file_enters_run_id(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(RULES)
    plain = run_config(Settings())
    with_rules = run_config(Settings(rules=path))
    assert "rules" not in plain  # runs without rules keep the ids they had
    assert run_id_of(with_rules) != run_id_of(plain)
    path.write_text(RULES.replace("%d-%m-%Y", "%Y-%m-%d"))
    assert run_id_of(run_config(Settings(rules=path))) != run_id_of(with_rules)
