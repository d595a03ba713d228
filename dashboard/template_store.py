"""The portal's personal saved job templates: each signed-in person's own named submissions,
kept by the dashboard in one small JSON file per person under `$TALLY_PORTAL_TEMPLATES_DIR`
(`tally` sets it to the `templates/` folder beside the dashboard's secrets, next to the ledger's
data directory), so they outlive a dashboard restart and follow the person to any browser.

Why here and not in the ledger or the scheduler: a template is a convenience of the form, not
an accounting fact or a scheduling decision — nothing bills, admits or audits from it, and a job
submitted from one is checked by the API like any other — so it stays out of the event-sourced
state and needs no new API resource; the dashboard, which alone reads and writes it, keeps it.
A file belongs to the signed-in person's user name from the verified login (`access.signed_in`;
the file name is a hash of it, never a path the person chose); a template holds only what the
form holds (no tokens, no environment), is validated by the configuration's own template rules
(`tally.portal_config.JobTemplateConfig`, the shared templates' rules) before it is written, and
a person keeps at most `MAX_TEMPLATES`. Writes are atomic (a temporary file renamed over the
old) under a per-person lock, so two sessions of one person never leave half a file. Several
dashboard replicas need the folder on shared storage.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from dashboard.portal_view import Template, template_dict, template_from_dict
from tally.portal_config import TEMPLATES_DIR_ENV, JobTemplateConfig

MAX_TEMPLATES = 50  # per person
MAX_ARG_CHARS = 4096  # per command argument


class TemplateError(ValueError):
    """The template cannot be saved; the message says why, for the person."""


def problem(template: Template) -> str | None:
    """Why `template` cannot be saved (the shared templates' rules), or None."""
    try:
        JobTemplateConfig.model_validate(template_dict(template))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "template"
        return f"{where}: {first['msg']}"
    if any(len(arg) > MAX_ARG_CHARS for arg in template.command):
        return f"command: an argument longer than {MAX_ARG_CHARS} characters"
    return None


@dataclass(frozen=True, slots=True)
class TemplateStore:
    directory: Path

    def _path(self, user: str) -> Path:
        return self.directory / f"{hashlib.sha256(user.encode()).hexdigest()[:32]}.json"

    @contextlib.contextmanager
    def _locked(self, user: str) -> Iterator[None]:
        """Holds `user`'s lock; a folder that cannot be written (a read-only volume) is a
        TemplateError that says where."""
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            with self._path(user).with_suffix(".lock").open("a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                yield
        except OSError as exc:
            raise TemplateError(f"templates cannot be kept in {self.directory}: {exc}") from None

    def mine(self, user: str) -> tuple[Template, ...]:
        """`user`'s templates by name; none for a missing or unreadable file."""
        try:
            data = json.loads(self._path(user).read_text(encoding="utf-8"))
            if data["user"] != user:
                return ()
            found = tuple(template_from_dict(t) for t in data["templates"])
        except (OSError, ValueError, TypeError, KeyError):
            return ()
        return tuple(sorted(found, key=lambda t: t.name))

    def _write(self, user: str, templates: tuple[Template, ...]) -> None:
        path = self._path(user)
        text = json.dumps({"user": user, "templates": [template_dict(t) for t in templates]})
        temporary = path.with_suffix(".tmp")
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)

    def save(self, user: str, template: Template) -> tuple[Template, ...]:
        """Save (or replace, by name) one of `user`'s templates; their templates after it.
        Raises TemplateError for an invalid template or one too many."""
        why = problem(template)
        if why is not None:
            raise TemplateError(why)
        with self._locked(user):
            others = tuple(t for t in self.mine(user) if t.name != template.name)
            if len(others) >= MAX_TEMPLATES:
                raise TemplateError(f"at most {MAX_TEMPLATES} templates each: delete one first")
            self._write(user, (*others, template))
        return self.mine(user)

    def delete(self, user: str, name: str) -> tuple[Template, ...]:
        """Delete `user`'s template `name` (nothing if there is none); their templates after."""
        with self._locked(user):
            kept = tuple(t for t in self.mine(user) if t.name != name)
            self._write(user, kept)
        return self.mine(user)


def store() -> TemplateStore | None:
    """The store `tally` configured (None: personal templates are not kept)."""
    directory = os.environ.get(TEMPLATES_DIR_ENV)
    return TemplateStore(Path(directory)) if directory else None
