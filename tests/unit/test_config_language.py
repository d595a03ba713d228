"""Configuration errors in Simplified Chinese, all of them (#15 item 9): every sentence Tally's
own validators write (`ledger.invalid.Invalid`: a template and its fields, found in the source
by its AST) is in the catalog with the same placeholders, and a table triggers each one, in
English exactly as before and in Chinese with the values as they are; every error type
pydantic can raise for the configuration's models (their core schema walked) is translated."""

from __future__ import annotations

import ast
import re
import string
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticKnownError

from ledger.invalid import Invalid
from tally import config_errors, language
from tally.alerts_config import AlertSinkConfig
from tally.cli.ledger_admin import parse_amount
from tally.cli.options import load_or_exit
from tally.config import (
    ConfigError,
    LedgerConfig,
    PriceConfig,
    TallyConfig,
    TeamConfig,
    parse_config,
)
from tally.identity_config import IdentityConfig
from tally.scheduler_config import QueueConfig
from tally.scheduling import load_tokens
from tests.builders import a_config_dict
from tests.config_error_cases import CASES, Case
from tests.conftest import REPO, write_config

CJK = re.compile("[\u4e00-\u9fff]")
# where `Invalid` is raised: the configuration's modules and the ledger's parsers they call
SCANNED = (REPO / "tally", REPO / "ledger")
# the configuration's modules: a validator there raises `Invalid`, never a bare ValueError
CONFIG_MODULES = sorted(
    p for p in (REPO / "tally").glob("*.py") if "config" in p.stem and p.stem != "config_errors"
)
# an `Invalid` raised by a CLI command's own parsing, said through the catalog by the command
CLI_ONLY = {"expected an integer", "not a whole number of GPU-milliseconds"}


def specs(text: str) -> list[tuple[str, str | None, str]]:
    """A template's fields with their conversion and format: `{team!r}`, `{limit:,}`."""
    return sorted(
        (name, conversion, spec or "")
        for _t, name, spec, conversion in string.Formatter().parse(text)
        if name is not None
    )


@cache
def raised_templates() -> dict[str, tuple[str, frozenset[str]]]:
    """Every `Invalid(template, **fields)` in the source → (file:line, the fields given); a
    template that is not a literal fails here, as it could not be translated."""
    found: dict[str, tuple[str, frozenset[str]]] = {}
    for directory in SCANNED:
        for path in sorted(directory.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Invalid":
                    where = f"{path.relative_to(REPO)}:{node.lineno}"
                    first = node.args[0] if node.args else None
                    assert isinstance(first, ast.Constant) and isinstance(first.value, str), (
                        f"{where}: not a literal template"
                    )
                    given = frozenset(k.arg for k in node.keywords if k.arg is not None)
                    found.setdefault(first.value, (where, given))
    return found


def test_no_configuration_validator_raises_a_bare_value_error() -> None:
    """A ValueError's free text could not be translated: the configuration's modules raise
    `Invalid` (a ValueError with its template) instead."""
    assert len(CONFIG_MODULES) >= 10
    bare = [
        f"{path.name}:{node.lineno}"
        for path in CONFIG_MODULES
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "ValueError"
    ]
    assert not bare, f"raise ledger.invalid.Invalid(template, **fields) instead: {bare}"


def test_every_validator_sentence_is_in_the_catalog() -> None:
    catalog = language.messages()
    templates = raised_templates()
    assert len(templates) > 70
    missing = {t: where for t, (where, _f) in templates.items() if not catalog.get(t, "").strip()}
    assert not missing, f"missing from tally/locale/zh_CN/LC_MESSAGES/tally.po: {missing}"
    for template, (where, given) in templates.items():
        assert {name for name, _c, _s in specs(template)} == given, (where, template)
        assert specs(catalog[template]) == specs(template), (where, template)
        assert CJK.search(catalog[template]), (where, template)


# ------------------------------------------------------------------ every sentence, triggered


def said(case: Case) -> tuple[str, str, Invalid]:
    """The case's error as the operator reads it (the file's line for a model), its field path
    (`location`) and the `Invalid` behind it, in the environment's language."""
    if not isinstance(case.model, type):
        with pytest.raises(Invalid) as caught:
            case.model()
        problem = caught.value
        return problem.say(language.translate), "", problem
    with pytest.raises(ValidationError) as invalid:
        case.model.model_validate(case.data)
    (error,) = invalid.value.errors()
    problem = error["ctx"]["error"]
    assert isinstance(problem, Invalid), error
    text = config_errors.format_validation_error("t.yaml", invalid.value)
    return text, config_errors.location(tuple(error["loc"])), problem


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_validators_sentence_in_english_and_chinese(
    monkeypatch: pytest.MonkeyPatch, case: Case
) -> None:
    """English byte for byte as before; Chinese from the catalog, with the file, the field
    path and the values as they are and no English sentence left."""
    monkeypatch.setenv("TALLY_LANG", language.EN)
    english, _where, problem = said(case)
    assert english == ("t.yaml: " if isinstance(case.model, type) else "") + case.said
    monkeypatch.setenv("TALLY_LANG", language.ZH_CN)
    chinese, where, _p = said(case)
    assert CJK.search(chinese) and str(problem) not in chinese, chinese
    if where:
        assert chinese.startswith(f"t.yaml: {where}: "), chinese
    for name, conversion, spec in specs(problem.template):
        value = ("{0" + (f"!{conversion}" if conversion else "") + f":{spec}}}").format(
            problem.fields[name]
        )
        assert value in chinese, (name, value, chinese)


def test_every_validator_sentence_has_a_case() -> None:
    """A new `Invalid` in the configuration's modules needs a row in `CASES` (which proves it
    translated and its English unchanged)."""
    triggered = set()
    for case in CASES.values():
        try:
            case.model() if not isinstance(case.model, type) else case.model.model_validate(
                case.data
            )
        except Invalid as exc:
            triggered.add(exc.template)
        except ValidationError as exc:
            triggered |= {e["ctx"]["error"].template for e in exc.errors() if "ctx" in e}
    untested = set(raised_templates()) - triggered - CLI_ONLY
    assert not untested, untested


# ------------------------------------------------------------- pydantic's own sentences

# the error types each kind of core schema raises itself (`pydantic_core.core_schema`); the
# kinds that only hold others raise none of their own
OWN_ERRORS: dict[str, tuple[str, ...]] = {
    "bool": ("bool_type", "bool_parsing"),
    "int": ("int_type", "int_parsing", "int_from_float", "int_parsing_size"),
    "float": ("float_type", "float_parsing"),
    "str": ("string_type", "string_unicode"),
    "dict": ("dict_type",),
    "tuple": ("tuple_type",),
    "list": ("list_type",),
    "literal": ("literal_error",),
    "enum": ("enum",),
    "model": ("model_type",),
    "model-fields": ("missing", "extra_forbidden"),
    "function-before": ("value_error",),  # a validator's own: `Invalid`, tested above
    "function-after": ("value_error",),
    "function-plain": ("value_error",),
    "function-wrap": ("value_error",),
    **dict.fromkeys(
        ("default", "nullable", "model-field", "json-or-python", "lax-or-strict", "union"), ()
    ),
    **dict.fromkeys(("definitions", "definition-ref", "is-instance"), ()),
}
BOUNDS = {
    "gt": "greater_than",
    "ge": "greater_than_equal",
    "lt": "less_than",
    "le": "less_than_equal",
    "multiple_of": "multiple_of",
    "pattern": "string_pattern_mismatch",
}
CHILDREN = ("schema", "items_schema", "keys_schema", "values_schema", "python_schema")
CHILDREN_LISTS = ("choices", "definitions")
EXAMPLE_CONTEXT = {
    "gt": 0, "ge": 0, "lt": 1, "le": 1, "expected": "'a' or 'b'", "min_length": 1,
    "max_length": 9, "pattern": "^x$", "class_name": "Team", "multiple_of": 2,
    "field_type": "Tuple", "actual_length": 0,
}  # fmt: skip


@dataclass
class Raised:
    """What a schema can raise: error types, a custom type's fixed message, kinds unknown."""

    kinds: set[str]
    custom: dict[str, str]
    unknown: set[str]


def errors_of(schema: Any, found: Raised) -> Raised:
    """Every error type validating (lax, from Python values: YAML's) with `schema` can give."""
    kind = schema["type"]
    if kind not in OWN_ERRORS:
        found.unknown.add(kind)
        return found
    found.kinds.update(OWN_ERRORS[kind])
    found.kinds.update(error for key, error in BOUNDS.items() if key in schema)
    if "min_length" in schema or "max_length" in schema:
        lengths = (
            ("string_too_short", "string_too_long") if kind == "str" else ("too_short", "too_long")
        )
        found.kinds.update(lengths)
    if kind == "float" and schema.get("allow_inf_nan") is False:
        found.kinds.add("finite_number")
    if kind == "union" and schema.get("custom_error_type"):  # its members' errors never show
        found.kinds.add(schema["custom_error_type"])
        message = config_errors.public_names(schema["custom_error_message"])
        found.custom[schema["custom_error_type"]] = message
        return found
    children: list[Any] = []
    for key in CHILDREN:  # a tuple's `items_schema` is a list, one per position
        child = schema.get(key)
        children += child if isinstance(child, list) else [child] if child else []
    if kind == "lax-or-strict":
        children.append(schema["lax_schema"])
    for key in CHILDREN_LISTS:
        children += [c[0] if isinstance(c, tuple) else c for c in schema.get(key, ())]
    children += schema.get("fields", {}).values()
    for child in children:
        errors_of(child, found)
    return found


def test_every_error_pydantic_raises_for_the_configuration_is_translated() -> None:
    """The configuration's models walked: each error type they can raise is one that
    `config_errors` translates, and the catalog has its sentence with its placeholders (a
    plural ending aside: `expected_plural` is filled with nothing)."""
    found = errors_of(TallyConfig.__pydantic_core_schema__, Raised(set(), {}, set()))
    assert not found.unknown, f"teach OWN_ERRORS the errors of {found.unknown}"
    assert {"string_too_short", "too_short", "path_type", "literal_error"} <= found.kinds
    untranslated = found.kinds - {"value_error"} - set(config_errors.PYDANTIC_TYPES)
    assert not untranslated, f"add to config_errors.PYDANTIC_TYPES and the catalog: {untranslated}"
    catalog = language.messages()
    for kind in config_errors.PYDANTIC_TYPES:
        template = found.custom.get(kind)
        if template is None:
            template = PydanticKnownError(kind, EXAMPLE_CONTEXT).message_template
        assert catalog.get(template, "").strip(), (kind, template)
        assert specs(catalog[template]) == specs(template), kind
    assert all(catalog.get(word) for word in ("Tuple", "List", "Dictionary"))  # {field_type}
    assert specs(catalog["{choices} or {last}"]) == specs("{choices} or {last}")  # {expected}


class Literally(BaseModel):
    """A choice whose values hold the word that separates choices."""

    choice: Literal["a or b", "x or y"]


@pytest.mark.parametrize(
    ("model", "data", "english", "chinese"),
    [
        (
            TeamConfig,
            {"name": "t", "projects": []},
            "projects: Tuple should have at least 1 item after validation, not 0",
            "projects: 列表（元组）经验证后应至少有 1 项，而不是 0 项",
        ),
        (
            IdentityConfig,
            {"scontrol": ["x"] * 17},
            "scontrol: Tuple should have at most 16 items after validation, not 17",
            "scontrol: 列表（元组）经验证后应至多有 16 项，而不是 17 项",
        ),
        (
            PriceConfig,
            {"model": "", "per_gpu_hour": "1"},
            "model: String should have at least 1 character",
            "model: 字符串应至少有 1 个字符",
        ),
        (
            PriceConfig,
            {"model": "m" * 65, "per_gpu_hour": "1"},
            "model: String should have at most 64 characters",
            "model: 字符串应至多有 64 个字符",
        ),
        (
            TeamConfig,
            {"name": "t", "projects": "p"},
            "projects: Input should be a valid tuple",
            "projects: 应为列表（元组）",
        ),
        (
            LedgerConfig,
            {"data_dir": 5},
            "data_dir: Input is not a valid path for <class 'pathlib.Path'>",
            "data_dir: 应为有效的路径",
        ),
        (
            QueueConfig,
            {"name": "q", "class": "x"},
            "class: Input should be 'training', 'inference' or 'dev'",
            "class: 应为 'training', 'inference' 或 'dev'",
        ),
        (
            Literally,
            {"choice": "c"},
            "choice: Input should be 'a or b' or 'x or y'",
            "choice: 应为 'a or b' 或 'x or y'",
        ),
        (
            AlertSinkConfig,
            {"name": "s", "kind": "mail", "url": "https://x"},
            "kind: Input should be 'slack', 'alertmanager', 'dingtalk', 'feishu' or 'wecom'",
            "kind: 应为 'slack', 'alertmanager', 'dingtalk', 'feishu' 或 'wecom'",
        ),
    ],
    ids=[
        "too-short",
        "too-long",
        "string-too-short",
        "string-too-long",
        "tuple",
        "path",
        "literal",
        "literal-or-in-a-choice",
        "enum",
    ],
)
def test_pydantics_sentence_in_english_and_chinese(
    monkeypatch: pytest.MonkeyPatch,
    model: type[BaseModel],
    data: dict[str, Any],
    english: str,
    chinese: str,
) -> None:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(data)
    for lang, said in ((language.EN, english), (language.ZH_CN, chinese)):
        monkeypatch.setenv("TALLY_LANG", lang)
        assert config_errors.format_validation_error("t.yaml", caught.value) == f"t.yaml: {said}"


@pytest.mark.parametrize(
    ("lang", "said"),
    [
        ("zh-CN", "错误：{path}: organisation: 团队 'vision' 重复出现"),
        ("en", "error: {path}: organisation: team 'vision' appears twice"),
    ],
    ids=["zh-CN", "en"],
)
def test_a_validators_sentence_ends_a_command_in_the_language(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    lang: str,
    said: str,
) -> None:
    """What a command does with an invalid file (`load_or_exit`): the validator's sentence in
    the language, exit code 2. (Not through `CliRunner`: a first invocation in Chinese would
    leave click's cached `--help` option in Chinese for the help-text tests.)"""
    team = {"name": "vision", "projects": ["p"]}
    data = a_config_dict(organisation={"cost_centres": [{"name": "r", "teams": [team, team]}]})
    path = write_config(tmp_path / "t.yaml", data)
    monkeypatch.setenv("TALLY_LANG", lang)
    with pytest.raises(SystemExit) as ended:
        load_or_exit(str(path))
    assert ended.value.code == 2
    assert capsys.readouterr().err.strip() == said.format(path=path)


@pytest.mark.parametrize(
    ("lang", "said"),
    [
        ("zh-CN", "{path}: tokens[0]: 角色 admin 属于整个组织，不能指定团队"),
        ("en", "{path}: tokens[0]: role admin is organisation-wide: no team"),
    ],
    ids=["zh-CN", "en"],
)
def test_a_tokens_files_caller_is_refused_in_the_language(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, lang: str, said: str
) -> None:
    tokens = tmp_path / "tokens.yaml"
    entry = {"name": "ops", "token": "t" * 16, "role": "admin", "team": "vision"}
    tokens.write_text(yaml.safe_dump({"tokens": [entry]}))
    config = parse_config(a_config_dict(scheduler={"tokens": {"file": str(tokens)}}))
    monkeypatch.setenv("TALLY_LANG", lang)
    with pytest.raises(ConfigError) as caught:
        load_tokens(config, {})
    assert str(caught.value) == said.format(path=tokens)


@pytest.mark.parametrize(
    ("amount", "unit", "said"),
    [
        ("1.5", "gpu_ms", "错误：--amount '1.5'（单位 gpu_ms）：应为整数"),
        (
            "0.0000000001",
            "gpu_hours",
            "错误：--amount '0.0000000001'（单位 gpu_hours）：不是整数个 GPU 毫秒",
        ),
        (
            "1.0000001",
            "money",
            "错误：--amount '1.0000001'（单位 money）：'1.0000001' 的小数超过六位",
        ),
    ],
    ids=["integer", "gpu-ms", "money-places"],
)
def test_a_commands_amount_is_refused_in_the_language(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    amount: str,
    unit: str,
    said: str,
) -> None:
    """`tally ledger adjust --amount`: the CLI's own parse says its `Invalid` through the
    catalog, the amount and unit as given."""
    monkeypatch.setenv("TALLY_LANG", language.ZH_CN)
    with pytest.raises(SystemExit) as ended:
        parse_amount(amount, unit)
    assert ended.value.code == 2
    assert capsys.readouterr().err.strip() == said


@pytest.mark.parametrize(
    ("message", "said"),
    [
        pytest.param(
            "Input is not a valid path for <class 'pathlib._local.Path'>",
            "Input is not a valid path for <class 'pathlib.Path'>",
            id="python-3.13-private-module",
        ),
        pytest.param(
            "Input is not a valid path for <class 'pathlib.Path'>",
            "Input is not a valid path for <class 'pathlib.Path'>",
            id="python-3.11-unchanged",
        ),
        pytest.param(
            "Input should be a valid integer", "Input should be a valid integer", id="plain"
        ),
    ],
)
def test_a_class_is_named_by_its_public_module_on_every_python(message, said):
    assert config_errors.public_names(message) == said
