"""A reward function served over HTTP: OpenRLHF's remote reward contract (``--reward.remote_url``). How it works:
docs/internals-recipes.md#remote-rewards."""

from __future__ import annotations

import http.client
import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request

REPLY_KEYS = ("rewards", "scores", "score")
RETRIED_STATUSES = {408, 429}


class RemoteRewardError(RuntimeError):
    """The remote reward server could not be reached or answered out of contract; the message names the URL."""


def name_from_url(url: str) -> str:
    """A metric-friendly name for a URL.

    ``http://127.0.0.1:5000/get_reward`` -> ``remote_127_0_0_1_5000_get_reward``."""
    parts = urllib.parse.urlsplit(url)
    text = f"{parts.netloc}{parts.path}".strip("/")
    return "remote_" + (re.sub(r"[^A-Za-z0-9_-]+", "_", text).strip("_") or "reward")


def _content_text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: keep the text ones
        return "".join(part.get("text", "") if isinstance(part, dict) else str(part) for part in content)
    return "" if content is None else str(content)


def flatten(value) -> str:
    """Text as it is; a message (or a list of them) as one ``"role: content"`` line per message."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        value = [value]
    return "\n".join(f"{message.get('role', '')}: {_content_text(message.get('content'))}" for message in value)


def build_query(prompt, completion) -> str:
    if isinstance(prompt, str) and isinstance(completion, str):
        return prompt + completion
    return flatten(prompt) + "\n" + flatten(completion)


def _json_default(value):
    for method in ("item", "tolist"):  # numpy / torch scalars and arrays in a label column
        if hasattr(value, method):
            return getattr(value, method)()
    return str(value)


class RemoteReward:
    """A reward function that POSTs each batch to ``url`` (OpenRLHF's remote reward contract; see the module).

    Args:
        url: the server's endpoint, ``http://`` or ``https://``.
        timeout_s: seconds each request may take.
        retries: how many times a failed request (connection error, timeout, HTTP 5xx/408/429) is sent again.
        label_column: the dataset column sent as ``labels`` (null when the batch has none).
        name: the function's ``__name__`` (metric names ``rewards/<name>/mean``); default from the URL.
        backoff_s: the wait before the first retry, doubled for each further one (at most 5 s).
    """

    def __init__(self, url: str, timeout_s: float = 30.0, retries: int = 2, label_column: str = "label",
                 name: str | None = None, backoff_s: float = 0.25):
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise ValueError(f"RemoteReward: url must start with http:// or https://, got {url!r}")
        if not timeout_s > 0:
            raise ValueError(f"RemoteReward: timeout_s must be > 0, got {timeout_s!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"RemoteReward: retries must be an integer >= 0, got {retries!r}")
        self.url = url
        self.timeout_s = float(timeout_s)
        self.retries = retries
        self.label_column = label_column
        self.backoff_s = backoff_s
        self.__name__ = name or name_from_url(url)

    def __repr__(self) -> str:
        return f"RemoteReward({self.url!r}, name={self.__name__!r})"

    def payload(self, prompts: list, completions: list, kwargs: dict) -> dict:
        labels = kwargs.get(self.label_column)
        return {
            "query": [build_query(p, c) for p, c in zip(prompts, completions, strict=True)],
            "prompts": [flatten(p) for p in prompts],
            "labels": None if labels is None else list(labels),
        }

    def __call__(self, prompts: list, completions: list, completion_ids: list | None = None, **kwargs) -> list:
        body = json.dumps(self.payload(prompts, completions, kwargs), default=_json_default).encode()
        reply = self._post(body)
        rewards = self._rewards_from(reply, len(completions))
        log_metric = kwargs.get("log_metric")
        extra = reply.get("extra_logs") if isinstance(reply, dict) else None
        if callable(log_metric) and isinstance(extra, dict):
            for key, values in extra.items():
                numbers = [float(v) for v in (values if isinstance(values, list) else [values])
                           if isinstance(v, (int, float)) and math.isfinite(v)]
                if numbers:
                    log_metric(key, sum(numbers) / len(numbers))
        return rewards

    def _post(self, body: bytes):
        attempts = self.retries + 1
        last = ""
        for attempt in range(attempts):
            if attempt:
                time.sleep(min(self.backoff_s * 2 ** (attempt - 1), 5.0))
            request = urllib.request.Request(self.url, data=body, method="POST",
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    raw = response.read()
            except urllib.error.HTTPError as exc:
                detail = exc.read()[:200].decode(errors="replace").strip()
                last = f"HTTP {exc.code} {exc.reason}" + (f": {detail}" if detail else "")
                if exc.code < 500 and exc.code not in RETRIED_STATUSES:
                    raise RemoteRewardError(f"remote reward {self.__name__!r}: POST {self.url} got {last}") from None
                continue
            except (OSError, http.client.HTTPException) as exc:  # URLError, timeouts, refused or dropped connections
                reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
                last = (f"timed out after {self.timeout_s:g} s" if isinstance(reason, TimeoutError)
                        else f"{type(reason).__name__}: {reason}")
                continue
            try:
                return json.loads(raw)
            except ValueError:
                raise RemoteRewardError(f"remote reward {self.__name__!r}: POST {self.url} replied with something "
                                        f"that is not JSON: {raw[:200]!r}") from None
        raise RemoteRewardError(f"remote reward {self.__name__!r}: POST {self.url} failed {attempts} time(s); "
                                f"the last: {last}")

    def _rewards_from(self, reply, expected: int) -> list:
        rewards = reply
        if isinstance(reply, dict):
            key = next((k for k in REPLY_KEYS if k in reply), None)
            if key is None:
                raise RemoteRewardError(f"remote reward {self.__name__!r}: the reply of {self.url} has none of the "
                                        f"keys {list(REPLY_KEYS)} (keys: {sorted(reply)[:10]})")
            rewards = reply[key]
        if not isinstance(rewards, list) or len(rewards) != expected:
            got = f"{len(rewards)} values" if isinstance(rewards, list) else type(rewards).__name__
            raise RemoteRewardError(f"remote reward {self.__name__!r}: {self.url} sent {got} for {expected} queries "
                                    f"(one reward per query expected)")
        return rewards
