"""What alert delivery needs to know about one webhook: `SinkSettings`, plain values.

The composition root (`tally.alerts_config`) validates the `alerts:` section of the configuration
file and translates each sink into these settings; delivery never reads configuration itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

ALERTMANAGER_PATH = "/api/v2/alerts"
DEFAULT_GROUP_ID = "tally-alerts"  # the alerts-topic consumer group


class SinkKind(StrEnum):
    """The payload format a webhook understands."""

    SLACK = "slack"
    ALERTMANAGER = "alertmanager"
    DINGTALK = "dingtalk"  # DingTalk custom robot (`oapi.dingtalk.com/robot/send?access_token=…`)
    FEISHU = "feishu"  # Feishu / Lark custom bot (`open.feishu.cn/open-apis/bot/v2/hook/…`)
    WECOM = "wecom"  # WeCom group robot (`qyapi.weixin.qq.com/cgi-bin/webhook/send?key=…`)


CHAT_KINDS = frozenset({SinkKind.DINGTALK, SinkKind.FEISHU, SinkKind.WECOM})


@dataclass(frozen=True, slots=True)
class SinkSettings:
    """One webhook and how to deliver to it.

    `url` is the Slack (or compatible) incoming-webhook URL, or Alertmanager's base URL
    (`http://host:9093`; alerts are posted to `/api/v2/alerts` under it). Failed tries are
    retried after `backoff_initial_s`, doubling up to `backoff_max_s`, for at most
    `max_attempts` tries. Firing alerts are re-posted to Alertmanager every
    `resend_interval_s` (0: never). `secret` is the signing secret of a DingTalk or Feishu
    robot whose security setting is "signature" (None: requests are not signed).
    """

    name: str
    kind: SinkKind
    url: str
    timeout_s: float
    max_attempts: int
    backoff_initial_s: float
    backoff_max_s: float
    queue_size: int
    resend_interval_s: float
    headers: Mapping[str, str] = field(default_factory=dict)
    dashboard_url: str | None = None
    secret: str | None = None

    @property
    def endpoint(self) -> str:
        """Where the payloads are posted."""
        base = self.url.rstrip("/")
        if self.kind is SinkKind.ALERTMANAGER and not base.endswith(ALERTMANAGER_PATH):
            return base + ALERTMANAGER_PATH
        return self.url
