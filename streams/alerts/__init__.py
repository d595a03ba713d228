"""Alert delivery: alerts from the alerts topic to webhooks (Slack, Alertmanager, and the
DingTalk, Feishu/Lark and WeCom robots), and the watch that raises budget and idle-time alerts.

This package owns the machinery behind `tally alerts`; the composition root (`tally`) translates
the `alerts:` configuration into `SinkSettings` and starts it. By concern:

- `settings`: `SinkKind`, `SinkSettings` — what delivery needs to know about one webhook;
- `texts`: what a person reads about each alert kind (title, summary, facts);
- `payloads`: the body each kind of sink receives, and `request_for` (signed per try);
- `chat`: the DingTalk, Feishu and WeCom formats, signing, size limits and error codes;
- `webhook`: one POST and its outcome (`Attempt`), the one place `requests` errors are handled;
- `delivery_log`: `DeliveryLog`, the per-(sink, alert id) record that deduplicates across
  restarts;
- `sinks`: `SinkWorker`, one bounded queue and delivery thread per webhook;
- `dispatcher`: `AlertDispatcher`, fan-out to every sink;
- `consumer`: `consume_alerts`, the alerts-topic loop (consumer group `tally-alerts`);
- `probe`: `send_test`, a test alert to one sink now (`tally alerts test`);
- `watch`: `AlertWatch` / `run_watch`, budget burn (from `balances`) and teams' daily idle GPU
  time (from the idle-GPU alerts) published as alerts on the alerts topic.

Alerts are decoded by `ledger.fleet_alerts.decode_any_alert`, next to their encoders. Import
from the submodules: this package's `__init__` imports nothing, so reading `settings` (as the
configuration does) does not load `requests` or aiokafka.

Guarantees:
- **At least once per sink, deduplicated by alert id.** An alert's id is content-derived
  (`ledger.alerts.IdleAlert.id`, `ledger.fleet_alerts`), so a redelivered message is the same alert.
  Before the topic offset is committed, each sink's copy is recorded `queued` in the delivery log
  (`<data_dir>/alerts/deliveries.jsonl`, appended and fsynced); a sink's copy is recorded `sent`
  after a 2xx answer, or `dropped` with the reason. On start, copies still `queued` are queued
  again; ids the log knows are never queued twice for the same sink.
- **A webhook that is down never blocks the stream or the other sinks.** Each sink has its own
  bounded queue and delivery thread; the consumer only appends to the log and puts without waiting.
  A full queue drops the alert for that sink (recorded, logged and counted as `queue_full`), never
  silently.
- **Retries with exponential backoff.** Timeouts, connection errors, 408, 429 and 5xx are retried
  after `backoff_initial_s`, doubling up to `backoff_max_s`, for at most `max_attempts` tries, then
  dropped as `gave_up`; other 4xx answers are dropped at once as `rejected` (resending the same
  payload cannot succeed). A chat robot's HTTP 200 with a non-zero error code is a failed try,
  retried only for the vendor's rate-limit codes (`chat`). Every failed try is counted and logged; a
  sink whose latest try failed is reported down (`SinkWorker.up`, the `tally_alert_sink_up` metric).
- **Resolve notifications.** `IdleGpuResolved` and the other resolutions are delivered like any
  alert. Slack and the robots receive a "resolved" message; Alertmanager receives the same labels
  with `endsAt` set (one-shot alerts, never resolved, end a day after they fired). Firing alerts are
  re-posted to Alertmanager every `resend_interval_s` (with `endsAt` four intervals ahead, as
  Prometheus does) so they do not expire while the GPU stays idle.
"""
