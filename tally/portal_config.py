"""The self-service portal's saved job templates (`dashboard.job_templates`): what the "My
jobs" page of the dashboard offers to fill its submit form from. Handed to the dashboard as
JSON in `$TALLY_JOB_TEMPLATES` (`portal_env`); the dashboard reads them with
`dashboard.portal_view.templates_from_json`. Personal templates, which each person saves in
the dashboard, are kept under `$TALLY_PORTAL_TEMPLATES_DIR` (`dashboard.template_store`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from pydantic import Field

from tally.config_fields import Name, Strict

TEMPLATES_ENV = "TALLY_JOB_TEMPLATES"
API_URL_ENV = "TALLY_API_URL"
TEMPLATES_DIR_ENV = "TALLY_PORTAL_TEMPLATES_DIR"


class JobTemplateConfig(Strict):
    """A saved submission: queue, project, GPUs and model, estimate and command."""

    name: str = Field(min_length=1, max_length=64)
    queue: Name
    project: Name
    gpus: int = Field(1, ge=1, le=1024)
    model: str | None = Field(None, min_length=1, max_length=128)
    estimated_runtime_hours: float = Field(1.0, gt=0, le=366 * 24)
    command: tuple[str, ...] = Field(min_length=1, max_length=256)


def templates_json(templates: Sequence[JobTemplateConfig]) -> str:
    return json.dumps([t.model_dump(mode="json") for t in templates])
