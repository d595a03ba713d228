"""The dashboard's single sign-on wiring (`auth.oidc.dashboard`): the `[auth]` section of the
Streamlit secrets file that `st.login` reads (client id, the client and cookie secrets from
the environment, the issuer's discovery URL, the redirect URI), written mode 0600 where
`secrets_path` says, and the claim mapping the dashboard is handed (`login_env`). `tally
dashboard` and `tally up` write the file before Streamlit starts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from ledger.role_claims import ClaimMapping
from tally.config import TallyConfig
from tally.config_fields import secret_from_env
from tally.portal_config import API_URL_ENV, TEMPLATES_DIR_ENV, TEMPLATES_ENV, templates_json

LOGIN_ENV = "TALLY_OIDC_LOGIN"  # the claim mapping, as JSON (`ClaimMapping.to_json`)


def login_configured(config: TallyConfig) -> bool:
    return config.auth.oidc is not None and config.auth.oidc.dashboard is not None


def secrets_path(config: TallyConfig) -> Path:
    """Where the dashboard's secrets file is written: beside the ledger's data directory."""
    return config.ledger.data_dir.parent / "dashboard" / "secrets.toml"


def secrets_toml(config: TallyConfig, environ: Mapping[str, str] | None = None) -> str | None:
    """The secrets file's text (None: no dashboard login configured). Raises ConfigError when
    a secret's environment variable is not set."""
    oidc = config.auth.oidc
    if oidc is None or oidc.dashboard is None:
        return None
    login = oidc.dashboard
    field = "auth.oidc.dashboard"
    values = {
        "redirect_uri": login.redirect_uri
        or f"http://{config.dashboard.host}:{config.dashboard.port}/oauth2callback",
        "cookie_secret": secret_from_env(
            f"{field}.cookie_secret_env", login.cookie_secret_env, environ
        ),
        "client_id": login.client_id,
        "client_secret": secret_from_env(
            f"{field}.client_secret_env", login.client_secret_env, environ
        ),
        "server_metadata_url": oidc.discovery(),
        # the person's access token, forwarded to the scheduler's API by the portal
        "expose_tokens": ["access"],
    }
    # A JSON string is a valid TOML basic string (the same escapes).
    lines = ["# written by tally from auth.oidc.dashboard: do not edit", "[auth]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def write_secrets(config: TallyConfig, environ: Mapping[str, str] | None = None) -> Path | None:
    """Write the secrets file (mode 0600, replaced whole); its path, or None without a
    dashboard login. Raises ConfigError for a missing secret, before anything is written."""
    text = secrets_toml(config, environ)
    if text is None:
        return None
    path = secrets_path(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".toml.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(partial, 0o600)
    partial.replace(path)
    return path


def login_env(config: TallyConfig) -> dict[str, str]:
    """The dashboard's environment for its login: the claim mapping (none without a login)."""
    oidc = config.auth.oidc
    if oidc is None or oidc.dashboard is None:
        return {}
    return {LOGIN_ENV: ClaimMapping(oidc.rules(), oidc.user_claim).to_json()}


def portal_env(config: TallyConfig) -> dict[str, str]:
    """The portal's environment (only with a dashboard login: it acts as the signed-in person):
    the scheduler API's URL, the configuration's job templates and the folder of the personal
    ones (`templates/` beside the secrets file)."""
    if not login_configured(config):
        return {}
    s = config.scheduler
    return {
        API_URL_ENV: f"http://{s.host}:{s.port}",
        TEMPLATES_ENV: templates_json(config.dashboard.job_templates),
        TEMPLATES_DIR_ENV: str(secrets_path(config).parent.resolve() / "templates"),
    }
