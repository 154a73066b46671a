"""Posting the postmortem into the incident's Slack thread (``whywait replay --slack-thread CHANNEL:TS``).

Called after the report is built: the summary goes into the thread as a message, then
the main timeline PNG with ``files_upload_v2`` (Slack's current upload flow:
``files.getUploadURLExternal``, the upload, ``files.completeUploadExternal``).  The
token is ``SLACK_BOT_TOKEN`` (or ``_FILE``), the API ``WHYWAIT_SLACK_API_URL`` when set,
as for the engine's notifier.  Failures are one line (:class:`~whywait.engine.errors.NotifyError`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from whywait.engine.errors import ConfigError, NotifyError

if TYPE_CHECKING:
    from whywait.engine.report import Report


def parse_thread(target: str) -> tuple[str, str]:
    """``C024BE91L:1764442800.000100`` (or ``#channel:ts``) → ``(channel, thread ts)``."""
    channel, sep, ts = target.rpartition(":")
    if not sep or not channel or not re.fullmatch(r"\d+\.\d+", ts):
        raise ConfigError(f"--slack-thread: expected CHANNEL:TS such as C024BE91L:1764442800.000100 (got {target!r})")
    return channel, ts


def post_to_thread(report: Report, target: str, tmp: Path) -> None:
    """Post the report's summary and timeline PNG as replies in the thread ``target``."""
    from slack_sdk import WebClient
    from slack_sdk.errors import SlackApiError, SlackClientError
    from whywait.engine.notify.secrets import read_secret

    channel, ts = parse_thread(target)
    token = read_secret("SLACK_BOT_TOKEN")
    if token is None:
        raise ConfigError("--slack-thread needs SLACK_BOT_TOKEN (or SLACK_BOT_TOKEN_FILE)")
    client = WebClient(token=token.reveal(), timeout=30,
                       base_url=os.environ.get("WHYWAIT_SLACK_API_URL") or WebClient.BASE_URL)
    png = report.timeline_png(tmp / "timeline.png")
    text = thread_text(report.summary_lines())
    try:
        if channel.startswith("#"):
            channel = _channel_id(client, channel)
        client.chat_postMessage(channel=channel, thread_ts=ts, text=text)
        client.files_upload_v2(channel=channel, thread_ts=ts, file=str(png), filename="timeline.png",
                               title="whywait timeline (UTC)")
    except SlackApiError as exc:
        raise NotifyError(f"Slack refused the postmortem: {exc.response.get('error')}", retryable=False) from None
    except (SlackClientError, OSError) as exc:
        raise NotifyError(f"Slack unreachable: {exc}", retryable=True) from None


#: Slack advises at most 4,000 characters of message text (and cuts at 40,000): a window with a hundred incidents
#: has a summary line each, so the thread gets the first ones and the count of the rest; the report has them all.
MAX_TEXT = 3_900


def thread_text(lines: list[str], limit: int = MAX_TEXT) -> str:
    """The summary as one Slack message: incident lines while they fit in ``limit``, the totals line always last."""
    lines = [mrkdwn(line) for line in lines]
    head, *incidents = ["*Postmortem (whywait replay)*", *lines[:-1]]
    tail = lines[-1] if lines else ""
    room = 80  # kept for the "…and N more" line
    out, size = [head], len(head) + len(tail) + room
    for k, line in enumerate(incidents):
        if size + len(line) + 1 > limit:
            out.append(f"…and {len(incidents) - k} more incident(s): the report (`--report DIR`) has every one.")
            break
        out.append(line)
        size += len(line) + 1
    return "\n".join([*out, tail])


def mrkdwn(line: str) -> str:
    """A line of the report's Markdown in Slack's mrkdwn: bold with one asterisk, names literal.

    The Markdown escapes names with backslashes, which Slack shows as they are; Slack reads ``&``, ``<``
    and ``>`` instead (``<!channel>`` in a job name would ping the channel), so those are escaped.
    """
    from whywait.engine.report.render import _tokens

    def lit(v: str) -> str:
        return v.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

    return "".join("*" if k == "bold" else f"`{lit(v)}`" if k == "code" and "`" not in v else lit(v)
                   for k, v in _tokens(line))


def _channel_id(client: object, name: str) -> str:
    """The id of channel ``#name``, paging through the workspace's channels (public and private ones the app is in)."""
    cursor = None
    for _ in range(100):  # 100 pages of 200: a workspace of 20,000 channels
        resp = client.conversations_list(limit=200, cursor=cursor,  # type: ignore[attr-defined]
                                         types="public_channel,private_channel", exclude_archived=True)
        for c in resp.get("channels", []):
            if c.get("name") == name.lstrip("#"):
                return str(c["id"])
        cursor = (resp.get("response_metadata") or {}).get("next_cursor")
        if not cursor:
            break
    raise NotifyError(f"Slack channel {name} not found (is the app invited to it?)", retryable=False)
