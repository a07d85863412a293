"""The pre-delete hook's program (ate_devplugin.dra.uninstall) against a fake API server
behind lightkube's real client: the requests it makes, the waiting, and its exit codes.
tests/e2e/test_dra_migration.py runs it in the chart's hook on a real cluster."""

from __future__ import annotations

import runpy
import sys
from collections.abc import Callable
from typing import Any

import httpx2
import pytest
from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig

from ate_devplugin.dra import uninstall

PATH = "/apis/apps/v1/namespaces/ate-system/daemonsets/"


class FakeApi:
    """DaemonSets that stay for ``polls`` GETs after their foreground delete."""

    def __init__(self, polls: dict[str, int], refuse: int = 0) -> None:
        self.polls = polls
        self.refuse = refuse
        self.requests: list[tuple[str, str, Any]] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        name = request.url.path.removeprefix(PATH)
        self.requests.append((request.method, name, dict(request.url.params)))
        if self.refuse:
            return status(self.refuse, "daemonsets.apps is forbidden")
        if name not in self.polls:
            return status(404, f'daemonsets.apps "{name}" not found')
        if request.method == "GET":
            if self.polls[name] == 0:
                del self.polls[name]
                return status(404, f'daemonsets.apps "{name}" not found')
            self.polls[name] -= 1
        labels = {"app.kubernetes.io/name": "ate-devplugin"}
        obj = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, "namespace": "ate-system"},
               "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}}}}  # fmt: skip
        return httpx2.Response(200, json=obj)


def status(code: int, message: str) -> httpx2.Response:
    return httpx2.Response(code, json={"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                       "message": message, "code": code})  # fmt: skip


def client(api: Callable[[httpx2.Request], httpx2.Response]) -> Client:
    config = KubeConfig.from_dict({
        "clusters": [{"name": "c", "cluster": {"server": "https://api.test"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    })  # fmt: skip
    return Client(config, transport=httpx2.MockTransport(api))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_each_daemonset_is_deleted_in_the_foreground_and_waited_for(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi({"ate-devplugin-a": 3, "ate-devplugin-b": 1})
    clock = Clock()
    left = uninstall.stop_daemonsets(client(api), "ate-system", ["ate-devplugin-a", "ate-devplugin-b"], 10,
                                     clock=clock, sleep=clock.sleep)  # fmt: skip
    assert left == []
    deletes = [(name, params) for method, name, params in api.requests if method == "DELETE"]
    assert deletes == [
        ("ate-devplugin-a", {"propagationPolicy": "Foreground"}),  # the pods go before the DaemonSet
        ("ate-devplugin-b", {"propagationPolicy": "Foreground"}),
    ]
    gets = [name for method, name, _ in api.requests if method == "GET"]
    assert gets.count("ate-devplugin-a") == 4  # three times there, then gone
    assert clock.now == 3 * uninstall.POLL_S
    assert "gone after 1.5s: ate-devplugin-a, ate-devplugin-b" in capsys.readouterr().err


def test_the_probers_go_first_and_share_the_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    """--first: the prober's DaemonSet is deleted and gone before the driver's is deleted (its
    pods' claims need a running driver to be unprepared); the wait for both is one timeout."""
    api = FakeApi({"ate-devplugin-kvm-prober": 2, "ate-devplugin": 1000})
    clock = Clock()
    argv = ["--namespace", "ate-system", "--timeout", "5", "--first", "ate-devplugin-kvm-prober", "ate-devplugin"]
    assert uninstall.main(argv, client(api), clock=clock, sleep=clock.sleep) == 0
    calls = [(method, name) for method, name, _ in api.requests]
    assert calls[:4] == [("DELETE", "ate-devplugin-kvm-prober"), *[("GET", "ate-devplugin-kvm-prober")] * 3]
    assert calls[4] == ("DELETE", "ate-devplugin")
    assert clock.now == 5  # 1 s for the prober, the 4 s left for the driver
    err = capsys.readouterr().err
    assert "gone after 1.0s: ate-devplugin-kvm-prober" in err
    assert "still there after 4.0s: ate-devplugin;" in err


def test_a_daemonset_already_gone_is_no_error() -> None:
    api = FakeApi({})
    assert uninstall.main(["--namespace", "ate-system", "ate-devplugin"], client(api)) == 0
    assert [m for m, _, _ in api.requests] == ["DELETE", "GET"]


def test_the_wait_ends_at_the_timeout_and_the_uninstall_goes_on(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi({"ate-devplugin": 1000})
    clock = Clock()
    left = uninstall.stop_daemonsets(client(api), "ate-system", ["ate-devplugin"], 2, clock=clock, sleep=clock.sleep)
    assert left == ["ate-devplugin"]
    assert clock.now == 2
    assert "still there after 2.0s: ate-devplugin; the uninstall goes on" in capsys.readouterr().err


def test_a_refused_call_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi({"ate-devplugin": 0}, refuse=403)
    assert uninstall.main(["--namespace", "ate-system", "ate-devplugin"], client(api)) == 1
    assert "the API server refused: 403 daemonsets.apps is forbidden" in capsys.readouterr().err


def test_a_refused_get_exits_1() -> None:
    api = FakeApi({"ate-devplugin": 0})
    api_calls = api.__call__

    def refuse_gets(request: httpx2.Request) -> httpx2.Response:
        return status(401, "Unauthorized") if request.method == "GET" else api_calls(request)

    assert uninstall.main(["--namespace", "ate-system", "ate-devplugin"], client(refuse_gets)) == 1


def test_no_credentials_exits_2(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.setattr("lightkube.config.kubeconfig.SERVICE_ACCOUNT", str(tmp_path / "no-sa"), raising=False)
    assert uninstall.main(["--namespace", "ate-system", "ate-devplugin"]) == 2


def test_bad_arguments_exit_2() -> None:
    with pytest.raises(SystemExit) as exc:
        uninstall.main(["ate-devplugin"])
    assert exc.value.code == 2


def test_run_as_a_module_it_is_the_hooks_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python3 -m ate_devplugin.dra.uninstall`, as the chart's hook runs it."""
    monkeypatch.setattr(sys, "argv", ["uninstall", "--help"])
    monkeypatch.delitem(sys.modules, "ate_devplugin.dra.uninstall")  # run afresh, as python -m does
    with pytest.raises(SystemExit) as exc:
        runpy.run_module("ate_devplugin.dra.uninstall", run_name="__main__")
    assert exc.value.code == 0
    assert "--namespace" in capsys.readouterr().out
