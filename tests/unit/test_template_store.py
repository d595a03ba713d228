"""Personal saved job templates (`dashboard.template_store`): a person's templates survive a new
store over the same folder (a dashboard restart), belong to that person only, are replaced by
name and deleted, are validated by the shared templates' rules before anything is written, and
are bounded in number; `tally` hands the dashboard the folder beside its secrets."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from dashboard.portal_view import Template
from dashboard.template_store import (
    MAX_ARG_CHARS,
    MAX_TEMPLATES,
    TemplateError,
    TemplateStore,
    problem,
)
from tally.config import parse_config
from tally.dashboard_login import portal_env, secrets_path
from tally.portal_config import TEMPLATES_DIR_ENV
from tests.builders import a_config_dict

SMOKE = Template("smoke", "dev", "detection", 2, None, 0.5, ("python", "train.py", "--fast"))


def test_a_saved_template_is_the_persons_own_and_survives_a_restart(tmp_path):
    TemplateStore(tmp_path).save("ada", SMOKE)
    again = TemplateStore(tmp_path)  # a restarted dashboard, another browser
    assert again.mine("ada") == (SMOKE,)
    assert again.mine("bo") == ()
    (stored,) = tmp_path.glob("*.json")
    assert "ada" not in stored.name  # the file is named by a hash, never by what a person typed
    assert json.loads(stored.read_text())["user"] == "ada"


def test_saving_by_the_same_name_replaces_and_delete_removes(tmp_path):
    store = TemplateStore(tmp_path)
    store.save("ada", SMOKE)
    store.save("ada", replace(SMOKE, name="big", gpus=8))
    assert store.save("ada", replace(SMOKE, gpus=4)) == (
        replace(SMOKE, name="big", gpus=8),
        replace(SMOKE, gpus=4),
    )
    assert store.delete("ada", "big") == (replace(SMOKE, gpus=4),)
    assert store.delete("ada", "absent") == (replace(SMOKE, gpus=4),)
    assert store.delete("ada", "smoke") == ()


def test_a_person_keeps_at_most_the_bound(tmp_path):
    store = TemplateStore(tmp_path)
    for i in range(MAX_TEMPLATES):
        store.save("ada", replace(SMOKE, name=f"t{i:02d}"))
    with pytest.raises(TemplateError, match=f"at most {MAX_TEMPLATES}"):
        store.save("ada", replace(SMOKE, name="one too many"))
    store.save("ada", replace(SMOKE, name="t00", gpus=3))  # replacing one is still fine
    assert len(store.mine("ada")) == MAX_TEMPLATES


@pytest.mark.parametrize(
    ("template", "why"),
    [
        pytest.param(replace(SMOKE, name=""), "name", id="no-name"),
        pytest.param(replace(SMOKE, name="x" * 65), "name", id="name-too-long"),
        pytest.param(replace(SMOKE, queue=""), "queue", id="no-queue"),
        pytest.param(replace(SMOKE, project="a b/c"), "project", id="project-not-a-name"),
        pytest.param(replace(SMOKE, gpus=0), "gpus", id="no-gpus"),
        pytest.param(replace(SMOKE, gpus=1025), "gpus", id="too-many-gpus"),
        pytest.param(replace(SMOKE, estimated_runtime_hours=0.0), "estimated", id="no-estimate"),
        pytest.param(replace(SMOKE, command=()), "command", id="no-command"),
        pytest.param(replace(SMOKE, command=("x" * (MAX_ARG_CHARS + 1),)), "command",
                     id="argument-too-long"),
    ],
)  # fmt: skip
def test_an_invalid_template_is_refused_before_anything_is_written(tmp_path, template, why):
    assert why in (problem(template) or "")
    with pytest.raises(TemplateError, match=why):
        TemplateStore(tmp_path).save("ada", template)
    assert TemplateStore(tmp_path).mine("ada") == ()


def test_an_unreadable_file_is_no_templates(tmp_path):
    store = TemplateStore(tmp_path)
    store.save("ada", SMOKE)
    (stored,) = tmp_path.glob("*.json")
    stored.write_text("{not json")
    assert store.mine("ada") == ()
    assert store.save("ada", SMOKE) == (SMOKE,)  # and saving again writes a good one


def test_tally_hands_the_dashboard_the_folder_beside_its_secrets():
    oidc = {
        "issuer": "http://127.0.0.1:9000",
        "audience": "tally",
        "roles": [{"value": "vision", "role": "member", "team": "vision"}],
        "dashboard": {"client_id": "tally-dashboard"},
    }
    config = parse_config(a_config_dict(auth={"oidc": oidc}))
    folder = portal_env(config)[TEMPLATES_DIR_ENV]
    assert folder == str(secrets_path(config).parent.resolve() / "templates")
    assert TEMPLATES_DIR_ENV not in portal_env(parse_config(a_config_dict()))


def test_a_folder_that_cannot_be_written_is_a_template_error(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # the folder's place is taken: nothing can be created under it
    store = TemplateStore(blocked / "templates")
    with pytest.raises(TemplateError, match="cannot be kept in"):
        store.save("ada", SMOKE)
    with pytest.raises(TemplateError, match="cannot be kept in"):
        store.delete("ada", "smoke")
    assert store.mine("ada") == ()
