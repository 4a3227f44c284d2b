"""The control room's one-time setup against a running Prefect API (make prefect-up runs it;
each step is idempotent): the project's block types, the host-slot limit, and, given a
webhook URL, the notifications of failed runs, rollbacks and firing alerts."""

from __future__ import annotations

import argparse
from datetime import timedelta
from urllib.parse import urlsplit

from prefect.blocks.webhook import Webhook
from prefect.client.orchestration import get_client
from prefect.events.actions import CallWebhook
from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

from blocks.hub import HubCredentials
from llm_release.canary import alertmanager
from llm_release.errors import ConfigError
from tasks.notify import ROLLBACK_EVENT
from tasks.slots import ensure_host_limit

WEBHOOK_BLOCK = "llm-release-notify"
# The flows whose failure a person must hear about (every deployment of prefect.yaml).
FLOWS = ["release", "model-update", "canary-rollout", "promote", "rollback", "eval-only"]

# Webhook bodies: Prefect renders them with its sandboxed Jinja from the event.
FAILED_RUN_BODY = (
    '{"kind": "run failed", "flow": {{ event.related | selectattr("role", "equalto", "flow") '
    '| map(attribute="name") | first | tojson }}, "flow_run": {{ event.resource.name | tojson }}, '
    '"state": {{ event.payload.validated_state.name | tojson }}, '
    '"message": {{ (event.payload.validated_state.message or "") | tojson }}}'
)
ROLLBACK_BODY = (
    '{"kind": "rollback", "release": {{ event.payload.release_id | tojson }}, '
    '"reason": {{ event.payload.reason | tojson }}}'
)


def register_blocks() -> None:
    """`prefect block register -m blocks.hub`, in-process: the block type shows in the UI's
    block catalogue (registering again updates it)."""
    HubCredentials.register_type_and_schema()


def automations(webhook_id) -> list[AutomationCore]:
    return [
        AutomationCore(
            name="llm-release: run failed",
            description="A release, update, rollout or operator action ended Failed or Crashed.",
            trigger=EventTrigger(
                expect={"prefect.flow-run.Failed", "prefect.flow-run.Crashed"},
                match_related={"prefect.resource.role": "flow", "prefect.resource.name": FLOWS},
                posture=Posture.Reactive,
                threshold=1,
                within=timedelta(0),
            ),
            actions=[CallWebhook(block_document_id=webhook_id, payload=FAILED_RUN_BODY)],
        ),
        AutomationCore(
            name="llm-release: rollback",
            description="A canary was rolled back (by the walk, or by a person), with the reason.",
            trigger=EventTrigger(
                expect={ROLLBACK_EVENT},
                posture=Posture.Reactive,
                threshold=1,
                within=timedelta(0),
            ),
            actions=[CallWebhook(block_document_id=webhook_id, payload=ROLLBACK_BODY)],
        ),
    ]


def setup_notifications(webhook_url: str) -> list[str]:
    """The webhook block and both automations; an automation of the same name is replaced,
    so running setup again changes nothing but what the arguments changed."""
    parts = urlsplit(webhook_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            "the webhook URL must be an http:// or https:// URL with a host",
            hint="give the URL your chat or paging tool issued for incoming webhooks",
        )
    url = webhook_url
    block_id = Webhook(url=url, method="POST").save(WEBHOOK_BLOCK, overwrite=True)
    # The alerts that fire go to the same URL, through the project's Alertmanager.
    alertmanager.for_home().save_webhook_url(url)
    names = []
    with get_client(sync_client=True) as client:
        for automation in automations(block_id):
            for old in client.read_automations_by_name(automation.name):
                client.delete_automation(old.id)
            client.create_automation(automation)
            names.append(automation.name)
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--webhook-url", help="notify this URL of failed runs and rollbacks")
    args = parser.parse_args()
    try:
        register_blocks()
        ensure_host_limit()
        print("blocks registered; host-slot limit llm-release-host present")
        if args.webhook_url:
            for name in setup_notifications(args.webhook_url):
                print(f"automation: {name} -> webhook block {WEBHOOK_BLOCK}")
            print("alerts: Alertmanager -> the same webhook")
    except ConfigError as exc:
        raise SystemExit(f"error: {exc.one_line()}") from None


if __name__ == "__main__":
    main()
