"""A local stand-in for the parts of the Hugging Face Hub API that trl-ext uses, for tests without network: creating a
model repo, uploading files (huggingface_hub's preupload + commit, every file as a regular git blob) and serving a
file (``config.json``) from a repo. It records every request, so a test can read what was sent. Point
huggingface_hub at it with ``HF_ENDPOINT`` in a subprocess (huggingface_hub reads it at import)."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class HubStandIn:
    """``with HubStandIn(files={"org/name": {"config.json": b"..."}}) as hub:`` serves at ``hub.url``;
    ``hub.requests`` lists ``(method, path, body)``; ``hub.commits[repo]`` the files each commit uploaded
    (path -> bytes); ``hub.validated`` the model cards' metadata (their YAML front matter, parsed)."""

    def __init__(self, files: dict | None = None):
        self.files = {repo: dict(content) for repo, content in (files or {}).items()}
        self.requests: list[tuple[str, str, bytes]] = []
        self.created: list[dict] = []
        self.validated: list[dict] = []
        self.commits: dict[str, list[dict]] = {}
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _body(self) -> bytes:
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _send(self, code: int, body: bytes = b"", headers: dict | None = None):
                self.send_response(code)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _json(self, data, code: int = 200):
                self._send(code, json.dumps(data).encode(), {"Content-Type": "application/json"})

            def do_POST(self):  # noqa: N802
                body = self._body()
                hub.requests.append(("POST", self.path, body))
                path = self.path.split("?")[0]
                if path == "/api/repos/create":
                    payload = json.loads(body)
                    hub.created.append(payload)
                    repo = f"{payload['organization']}/{payload['name']}"
                    return self._json({"url": f"{hub.url}/{repo}", "name": repo})
                if path == "/api/validate-yaml":  # the card's metadata, as the Hub checks it: valid YAML
                    import yaml

                    content = json.loads(body)["content"]
                    hub.validated.append(yaml.safe_load(content.split("---")[1]))
                    return self._json({})
                parts = path.strip("/").split("/")  # api, models, org, name, preupload|commit, revision
                if len(parts) < 6:
                    return self._send(404)
                repo = f"{parts[2]}/{parts[3]}"
                if parts[4] == "preupload":
                    files = json.loads(body)["files"]
                    return self._json({"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                                 for f in files]})
                if parts[4] == "commit":
                    uploaded = {}
                    for line in body.splitlines():
                        item = json.loads(line)
                        if item["key"] == "file":
                            uploaded[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                    hub.commits.setdefault(repo, []).append(uploaded)
                    hub.files.setdefault(repo, {}).update(uploaded)
                    oid = hashlib.sha1(body).hexdigest()
                    return self._json({"commitUrl": f"{hub.url}/{repo}/commit/{oid}", "commitOid": oid})
                return self._send(404)

            def _file(self):
                hub.requests.append((self.command, self.path, b""))
                parts = self.path.split("?")[0].strip("/").split("/")  # org, name, resolve, revision, file
                repo, name = f"{parts[0]}/{parts[1]}", "/".join(parts[4:])
                content = hub.files.get(repo, {}).get(name) if len(parts) > 4 and parts[2] == "resolve" else None
                if content is None:
                    return self._send(404, b"", {"X-Error-Code": "EntryNotFound"})
                etag = hashlib.sha1(content).hexdigest()
                return self._send(200, content, {"ETag": f'"{etag}"', "X-Repo-Commit": "0" * 40,
                                                 "Content-Type": "application/octet-stream"})

            do_GET = _file  # noqa: N815
            do_HEAD = _file  # noqa: N815

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def env(self, base: dict, hf_home) -> dict:
        """``base`` with huggingface_hub pointed at this stand-in, online, with a token and its cache in
        ``hf_home``."""
        return {**base, "HF_ENDPOINT": self.url, "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0",
                "HF_TOKEN": "hf_stand_in_token", "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HOME": str(hf_home)}
