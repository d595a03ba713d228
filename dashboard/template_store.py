"""The portal's personal saved job templates: each signed-in person's own named submissions,
kept by the dashboard in one small JSON file per person under `$TALLY_PORTAL_TEMPLATES_DIR`
(`tally` sets it to the `templates/` folder beside the dashboard's secrets, next to the ledger's
data directory), so they outlive a dashboard restart and follow the person to any browser.

Why here and not in the ledger or the scheduler: a template is a convenience of the form, not
an accounting fact or a scheduling decision — nothing bills, admits or audits from it, and a job
submitted from one is checked by the API like any other — so it stays out of the event-sourced
state and needs no new API resource; the dashboard, which alone reads and writes it, keeps it.
A file belongs to the signed-in person's OIDC subject (`sub` from the verified login,
`access.subject`: the issuer's stable id, never reassigned, unlike a user name or an email; the
file name is a hash of it, never a path the person chose); a template holds only what the
form holds (no tokens, no environment), is validated by the configuration's own template rules
(`tally.portal_config.JobTemplateConfig`, the shared templates' rules) before it is written, and
a person keeps at most `MAX_TEMPLATES`. Writes are atomic (a temporary file renamed over the
old) under a per-person lock, so two sessions of one person never leave half a file.

Templates saved before were keyed by the user name the login maps (`auth.oidc.user_claim`); a
person's first read with no file of their subject moves the file of their user name, if there
is one, to their subject's (under their lock, the old file removed after the new is written;
where the folder cannot be written they are read where they are). Whoever signs in first with
that user name takes them, as before the move.
Several
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
class Person:
    """Whose templates: the OIDC subject (`sub`), their key, and the user name the login maps,
    the key templates were kept by before (read to move them)."""

    subject: str
    user: str | None = None


def _hashed(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class TemplateStore:
    directory: Path

    def _path(self, person: Person) -> Path:
        # "sub:" keeps a subject's file apart from any user name's (the old files' names)
        return self.directory / f"{_hashed('sub:' + person.subject)}.json"

    def _by_name(self, user: str) -> Path:
        """The file of templates kept by user name, before subjects."""
        return self.directory / f"{_hashed(user)}.json"

    @contextlib.contextmanager
    def _locked(self, person: Person) -> Iterator[None]:
        """Holds `person`'s lock; a folder that cannot be written (a read-only volume) is a
        TemplateError that says where."""
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            with self._path(person).with_suffix(".lock").open("a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                yield
        except OSError as exc:
            raise TemplateError(f"templates cannot be kept in {self.directory}: {exc}") from None

    @staticmethod
    def _read(path: Path, key: str, owner: str) -> tuple[Template, ...] | None:
        """The templates in `path` when its `key` is `owner`; None for a missing, unreadable
        or someone else's file."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data[key] != owner or (key == "user" and "subject" in data):
                return None  # someone else's, or (by user name) a subject's file
            return tuple(template_from_dict(t) for t in data["templates"])
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def _own(self, person: Person) -> tuple[Template, ...] | None:
        return self._read(self._path(person), "subject", person.subject)

    def _named(self, person: Person) -> tuple[Template, ...] | None:
        """The templates kept by `person`'s user name (before subjects), if any."""
        if not person.user:
            return None
        return self._read(self._by_name(person.user), "user", person.user)

    def _moved(self, person: Person) -> tuple[Template, ...]:
        """Under `person`'s lock: their templates, those kept by their user name moved to
        their subject's file first."""
        own = self._own(person)
        if own is not None:
            return own
        named = self._named(person)
        if named is None:
            return ()
        self._write(person, named)
        assert person.user is not None  # `_named` found a file by it
        self._by_name(person.user).unlink(missing_ok=True)
        return named

    def mine(self, person: Person) -> tuple[Template, ...]:
        """`person`'s templates by name; none for a missing or unreadable file. The first read
        moves templates kept by their user name to their subject."""
        found = self._own(person)
        if found is None and person.user and self._by_name(person.user).exists():
            try:
                with self._locked(person):
                    found = self._moved(person)
            except TemplateError:  # the folder cannot be written: read them where they are
                found = self._named(person)
        return tuple(sorted(found or (), key=lambda t: t.name))

    def _write(self, person: Person, templates: tuple[Template, ...]) -> None:
        path = self._path(person)
        text = json.dumps(
            {
                "subject": person.subject,
                "user": person.user,
                "templates": [template_dict(t) for t in templates],
            }
        )
        temporary = path.with_suffix(".tmp")
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)

    def save(self, person: Person, template: Template) -> tuple[Template, ...]:
        """Save (or replace, by name) one of `person`'s templates; their templates after it.
        Raises TemplateError for an invalid template or one too many."""
        why = problem(template)
        if why is not None:
            raise TemplateError(why)
        with self._locked(person):
            others = tuple(t for t in self._moved(person) if t.name != template.name)
            if len(others) >= MAX_TEMPLATES:
                raise TemplateError(f"at most {MAX_TEMPLATES} templates each: delete one first")
            self._write(person, (*others, template))
        return self.mine(person)

    def delete(self, person: Person, name: str) -> tuple[Template, ...]:
        """Delete `person`'s template `name` (nothing if there is none); their templates after."""
        with self._locked(person):
            kept = tuple(t for t in self._moved(person) if t.name != name)
            self._write(person, kept)
        return self.mine(person)


def store() -> TemplateStore | None:
    """The store `tally` configured (None: personal templates are not kept)."""
    directory = os.environ.get(TEMPLATES_DIR_ENV)
    return TemplateStore(Path(directory)) if directory else None
