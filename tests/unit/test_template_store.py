"""Personal saved job templates (`dashboard.template_store`): a person's templates survive a new
store over the same folder (a dashboard restart), belong to that person's OIDC subject only
(not to a user name, which can change hands; those kept by user name before move to the subject
on first use), are replaced by name and deleted, are validated by the shared templates' rules
before anything is written, and are bounded in number; `tally` hands the dashboard the folder
beside its secrets."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from dashboard.portal_view import Template, template_dict
from dashboard.template_store import (
    MAX_ARG_CHARS,
    MAX_TEMPLATES,
    Person,
    TemplateError,
    TemplateStore,
    problem,
)
from tally.config import parse_config
from tally.dashboard_login import portal_env, secrets_path
from tally.portal_config import TEMPLATES_DIR_ENV
from tests.builders import a_config_dict

SMOKE = Template("smoke", "dev", "detection", 2, None, 0.5, ("python", "train.py", "--fast"))
ADA = Person("sub-ada", "ada")
BO = Person("sub-bo", "bo")


def test_a_saved_template_is_the_persons_own_and_survives_a_restart(tmp_path):
    TemplateStore(tmp_path).save(ADA, SMOKE)
    again = TemplateStore(tmp_path)  # a restarted dashboard, another browser
    assert again.mine(ADA) == (SMOKE,)
    assert again.mine(BO) == ()
    (stored,) = tmp_path.glob("*.json")
    assert "ada" not in stored.name  # the file is named by a hash, never by what a person typed
    assert json.loads(stored.read_text())["subject"] == "sub-ada"


def test_templates_follow_the_subject_not_the_user_name(tmp_path):
    store = TemplateStore(tmp_path)
    store.save(ADA, SMOKE)
    assert store.mine(Person("sub-ada", "ada.lovelace")) == (SMOKE,)  # renamed: still hers
    assert store.mine(Person("sub-other", "ada")) == ()  # her old name, someone else's now


def _kept_by_name(folder: Path, user: str, templates: list[Template]) -> Path:
    """A file as the store wrote it before subjects: named by a hash of the user name."""
    path = folder / f"{hashlib.sha256(user.encode()).hexdigest()[:32]}.json"
    path.write_text(json.dumps({"user": user, "templates": [template_dict(t) for t in templates]}))
    return path


BIG = replace(SMOKE, name="big", gpus=8)
MOVES = {  # what the person does first: (their templates after it, what it returned)
    "read": (lambda store: store.mine(ADA), (BIG, SMOKE)),
    "save": (lambda store: store.save(ADA, replace(SMOKE, gpus=4)), (BIG, replace(SMOKE, gpus=4))),
    "delete": (lambda store: store.delete(ADA, "big"), (SMOKE,)),
}


@pytest.mark.parametrize(("first", "after"), [pytest.param(*v, id=k) for k, v in MOVES.items()])
def test_templates_kept_by_user_name_move_to_the_subject_on_first_use(tmp_path, first, after):
    old = _kept_by_name(tmp_path, "ada", [SMOKE, BIG])
    store = TemplateStore(tmp_path)
    assert first(store) == after
    assert not old.exists()  # moved, not copied: the name may be someone else's later
    (moved,) = tmp_path.glob("*.json")
    assert json.loads(moved.read_text())["subject"] == "sub-ada"
    assert store.mine(ADA) == after
    assert store.mine(Person("sub-other", "ada")) == ()


def test_templates_kept_by_user_name_are_read_where_the_folder_cannot_be_written(tmp_path):
    old = _kept_by_name(tmp_path, "ada", [SMOKE])
    store = TemplateStore(tmp_path)
    (tmp_path / store._path(ADA).with_suffix(".lock").name).mkdir()  # the lock cannot be taken
    assert store.mine(ADA) == (SMOKE,)
    assert old.exists()
    with pytest.raises(TemplateError, match="cannot be kept in"):
        store.save(ADA, SMOKE)


def test_saving_by_the_same_name_replaces_and_delete_removes(tmp_path):
    store = TemplateStore(tmp_path)
    store.save(ADA, SMOKE)
    store.save(ADA, replace(SMOKE, name="big", gpus=8))
    assert store.save(ADA, replace(SMOKE, gpus=4)) == (
        replace(SMOKE, name="big", gpus=8),
        replace(SMOKE, gpus=4),
    )
    assert store.delete(ADA, "big") == (replace(SMOKE, gpus=4),)
    assert store.delete(ADA, "absent") == (replace(SMOKE, gpus=4),)
    assert store.delete(ADA, "smoke") == ()


def test_a_person_keeps_at_most_the_bound(tmp_path):
    store = TemplateStore(tmp_path)
    for i in range(MAX_TEMPLATES):
        store.save(ADA, replace(SMOKE, name=f"t{i:02d}"))
    with pytest.raises(TemplateError, match=f"at most {MAX_TEMPLATES}"):
        store.save(ADA, replace(SMOKE, name="one too many"))
    store.save(ADA, replace(SMOKE, name="t00", gpus=3))  # replacing one is still fine
    assert len(store.mine(ADA)) == MAX_TEMPLATES


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
        TemplateStore(tmp_path).save(ADA, template)
    assert TemplateStore(tmp_path).mine(ADA) == ()


def test_an_unreadable_file_is_no_templates(tmp_path):
    store = TemplateStore(tmp_path)
    store.save(ADA, SMOKE)
    (stored,) = tmp_path.glob("*.json")
    stored.write_text("{not json")
    assert store.mine(ADA) == ()
    assert store.save(ADA, SMOKE) == (SMOKE,)  # and saving again writes a good one


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
        store.save(ADA, SMOKE)
    with pytest.raises(TemplateError, match="cannot be kept in"):
        store.delete(ADA, "smoke")
    assert store.mine(ADA) == ()
