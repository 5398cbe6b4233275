"""RemoteReward against a real HTTP server on localhost (http.server in a thread; no mock)."""

import json
import pickle
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from trl_ext.user_code.workers import FunctionPool
from trl_ext.rewards.remote import RemoteReward, RemoteRewardError, name_from_url


class _Handler(BaseHTTPRequestHandler):
    """Endpoints: /score (1.0 where the label ends the query), /flaky (500 on every odd request), /slow (answers once
    the test lets it), /scores (OpenRLHF's other keys), /old (``score``), /list (bare list), /short
    (one value only), /bad, and 404."""

    def log_message(self, *args):  # quiet
        pass

    def _reply(self, status: int, payload) -> None:
        data = json.dumps(payload).encode() if not isinstance(payload, bytes) else payload
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        server = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with server.lock:
            server.requests.append((self.path, self.headers["Content-Type"], body))
            seen = sum(1 for path, _, _ in server.requests if path == self.path)
        labels = body["labels"] or [None] * len(body["query"])
        rewards = [None if label is None else float(q.endswith(str(label))) for q, label in zip(body["query"], labels)]
        if self.path == "/score":
            self._reply(200, {"rewards": rewards})
        elif self.path == "/flaky":
            self._reply(500, {"error": "warming up"}) if seen % 2 else self._reply(200, {"rewards": rewards})
        elif self.path == "/slow":
            server.release.wait(10)
            self._reply(200, {"rewards": rewards})
        elif self.path == "/scores":
            self._reply(200, {"scores": rewards, "extra_logs": {"passed": [1, 0, 1]}})
        elif self.path == "/old":
            self._reply(200, {"score": rewards})
        elif self.path == "/list":
            self._reply(200, rewards)
        elif self.path == "/short":
            self._reply(200, {"rewards": rewards[:1]})
        elif self.path == "/bad":
            self._reply(200, {"oops": 1})
        else:
            self._reply(404, b"no such endpoint")


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    httpd.lock = threading.Lock()
    httpd.requests = []
    httpd.release = threading.Event()
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield httpd
    httpd.release.set()
    httpd.shutdown()
    httpd.server_close()


def _requests(server, path):
    with server.lock:
        return [(content_type, body) for p, content_type, body in server.requests if p == path]


def test_posts_openrlhf_json_and_returns_the_rewards(server):
    reward = RemoteReward(server.url + "/score")
    assert reward.__name__ == f"remote_127_0_0_1_{server.server_address[1]}_score"
    out = reward(prompts=["2+2=", "2+3="], completions=["4", "6"], completion_ids=[[7, 2], [9, 2]],
                 label=["4", "5"], trainer_state={"global_step": 3}, log_extra=print, log_metric=print)
    assert out == [1.0, 0.0]
    content_type, body = _requests(server, "/score")[-1]
    assert content_type == "application/json"
    assert body == {"query": ["2+2=4", "2+3=6"], "prompts": ["2+2=", "2+3="], "labels": ["4", "5"]}


def test_labels_column_name_and_null_labels(server):
    reward = RemoteReward(server.url + "/score", label_column="answer", name="math_checker")
    assert reward.__name__ == "math_checker"
    assert reward(prompts=["1+1="], completions=["2"], answer=[2]) == [1.0]
    assert reward(prompts=["1+1="], completions=["2"], label=["2"]) == [None]  # no `answer` column: labels null
    assert [body["labels"] for _, body in _requests(server, "/score")[-2:]] == [[2], None]


def test_chat_messages_are_flattened_to_role_lines(server):
    prompt = [{"role": "system", "content": "Be brief."},
              {"role": "user", "content": [{"type": "text", "text": "2+2?"}]}]
    completion = [{"role": "assistant", "content": "4"}]
    assert RemoteReward(server.url + "/score")(prompts=[prompt], completions=[completion], label=["4"]) == [1.0]
    _, body = _requests(server, "/score")[-1]
    assert body["query"] == ["system: Be brief.\nuser: 2+2?\nassistant: 4"]
    assert body["prompts"] == ["system: Be brief.\nuser: 2+2?"]


def test_a_500_is_retried(server):
    reward = RemoteReward(server.url + "/flaky", retries=1, backoff_s=0.01)
    assert reward(prompts=["a"], completions=["b"], label=["b"]) == [1.0]
    assert len(_requests(server, "/flaky")) == 2  # the 500, then the answer
    with pytest.raises(RemoteRewardError, match=r"POST http://127\.0\.0\.1:\d+/flaky failed 1 time\(s\); the last: "
                                                r"HTTP 500"):
        RemoteReward(server.url + "/flaky", retries=0)(prompts=["a"], completions=["b"])  # the third request


def test_timeout_error_names_the_url(server):
    reward = RemoteReward(server.url + "/slow", timeout_s=0.2, retries=1, backoff_s=0.01)
    with pytest.raises(RemoteRewardError) as info:
        reward(prompts=["a"], completions=["b"])
    assert str(info.value) == (f"remote reward {reward.__name__!r}: POST {server.url}/slow failed 2 time(s); "
                               "the last: timed out after 0.2 s")


def test_other_reply_forms_and_extra_logs(server):
    logged = []
    kwargs = {"prompts": ["x", "y", "z"], "completions": ["1", "2", "3"], "label": ["1", "0", "3"]}
    assert RemoteReward(server.url + "/scores")(**kwargs, log_metric=lambda k, v: logged.append((k, v))) == [
        1.0, 0.0, 1.0]
    assert logged == [("passed", pytest.approx(2 / 3))]
    assert RemoteReward(server.url + "/old")(**kwargs) == [1.0, 0.0, 1.0]
    assert RemoteReward(server.url + "/list")(**kwargs) == [1.0, 0.0, 1.0]


def test_out_of_contract_replies_and_errors_are_not_retried(server):
    with pytest.raises(RemoteRewardError, match=r"/bad has none of the keys \['rewards', 'scores', 'score'\]"):
        RemoteReward(server.url + "/bad")(prompts=["a"], completions=["b"])
    with pytest.raises(RemoteRewardError, match=r"sent 1 values for 2 queries"):
        RemoteReward(server.url + "/short")(prompts=["a", "b"], completions=["c", "d"])
    before = len(_requests(server, "/missing"))
    with pytest.raises(RemoteRewardError, match=r"/missing got HTTP 404 Not Found: no such endpoint"):
        RemoteReward(server.url + "/missing", retries=3)(prompts=["a"], completions=["b"])
    assert len(_requests(server, "/missing")) == before + 1


def test_nothing_listening_names_the_url():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/reward"
    with pytest.raises(RemoteRewardError, match=rf"POST {url} failed 2 time\(s\); the last: ConnectionRefusedError"):
        RemoteReward(url, retries=1, backoff_s=0.01)(prompts=["a"], completions=["b"])


def test_in_a_worker_pool_and_pickled(server):
    reward = pickle.loads(pickle.dumps(RemoteReward(server.url + "/score", name="checker")))
    assert reward.__name__ == "checker"
    with FunctionPool([reward], num_workers=2, timeout_s=10) as pool:
        calls = [pool.submit(0, {"prompts": ["q"], "completions": [str(i)], "label": ["3"]}) for i in range(6)]
        assert [call.result().value for call in calls] == [[0.0], [0.0], [0.0], [1.0], [0.0], [0.0]]


def test_bad_arguments():
    with pytest.raises(ValueError, match="http"):
        RemoteReward("localhost:5000/reward")
    with pytest.raises(ValueError, match="retries"):
        RemoteReward("http://localhost:5000", retries=-1)
    assert name_from_url("https://verifier.internal/api/v1/score") == "remote_verifier_internal_api_v1_score"
