"""The dashboards' chart values: editable, the Grafana sidecar's folder annotation, the
PersesDashboard objects (perses-operator) for the Perses twins of the Grafana dashboards, and
names of the release's own, so that two releases render side by side."""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

import yaml

from tests.harness.chart import REPO, Helm, Manifest, by_kind, daemonsets

PERSES = sorted((REPO / "dashboards" / "perses").glob("*.json"))
PERSES_API = "perses.dev/v1alpha2/PersesDashboard"
# The default release's: stable, as generated (tests/dashboards' EXPECTED_UIDS).
DEFAULT = "ate-devplugin"


def grafana_dashboards(docs: list[Manifest]) -> dict[str, Any]:
    """File name (the key the sidecar writes) -> dashboard."""
    maps = [d for d in by_kind(docs, "ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]]
    return {name: json.loads(text) for cm in maps for name, text in cm["data"].items()}


def generated(name: str) -> Any:
    return json.loads((REPO / "dashboards" / name).read_text())


def test_the_default_release_ships_the_dashboards_as_generated(helm: Helm) -> None:
    shipped = grafana_dashboards(helm.template(release=DEFAULT))
    assert set(shipped) == {p.name for p in (REPO / "dashboards").glob("*.json")}
    for name, dashboard in shipped.items():
        assert dashboard == generated(name), "shipped as generated"
        assert dashboard["editable"] is False


def test_dashboards_are_not_editable_unless_asked(helm: Helm) -> None:
    shipped = grafana_dashboards(helm.template())
    assert shipped
    editable = grafana_dashboards(helm.template(sets=["dashboards.editable=true"]))
    assert set(editable) == set(shipped)
    for name, dashboard in editable.items():
        assert shipped[name]["editable"] is False
        assert dashboard["editable"] is True
        assert dashboard | {"editable": False} == shipped[name], "only editable differs"


def test_folder_annotation_works_with_the_sidecar_defaults(helm: Helm) -> None:
    """k8s-sidecar reads k8s-sidecar-target-directory unless told another annotation (the
    grafana chart's sidecar.dashboards.folderAnnotation, unset in kube-prometheus-stack)."""
    docs = helm.template()
    assert all("annotations" not in cm["metadata"] for cm in by_kind(docs, "ConfigMap"))
    for sets, annotation in (
        (["dashboards.folder=ate-devplugin"], "k8s-sidecar-target-directory"),
        (["dashboards.folder=ate-devplugin", "dashboards.folderAnnotation=grafana_folder"], "grafana_folder"),
    ):
        maps = [
            d for d in by_kind(helm.template(sets=sets), "ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]
        ]
        assert maps
        for cm in maps:
            assert cm["metadata"]["annotations"] == {annotation: "ate-devplugin"}


def test_perses_dashboards_only_when_enabled_and_served(helm: Helm) -> None:
    assert not by_kind(helm.template(api_versions=[PERSES_API]), "PersesDashboard"), "off by default"
    assert not by_kind(helm.template(sets=["persesDashboards.enabled=true"]), "PersesDashboard"), "no API"
    docs = helm.template(sets=["persesDashboards.enabled=true"], api_versions=[PERSES_API], release=DEFAULT)
    objects = {d["metadata"]["name"]: d for d in by_kind(docs, "PersesDashboard")}
    assert len(objects) == len(PERSES) == 2
    written = {
        d["metadata"]["name"]: d for d in yaml.safe_load_all((PERSES[0].parent / "persesdashboards.yaml").read_text())
    }
    for path in PERSES:
        dashboard = json.loads(path.read_text())
        got = objects[dashboard["metadata"]["name"]]
        assert got["apiVersion"] == "perses.dev/v1alpha2"
        assert got["metadata"]["namespace"] == "ate-system", "the release namespace: the Perses project"
        assert got["spec"] == {"config": dashboard["spec"]}
        assert got["spec"] == written[dashboard["metadata"]["name"]]["spec"], "as dashboards/generate.py writes them"
    forced = helm.template(
        sets=[
            "persesDashboards.enabled=true",
            "forceMonitoringApi=true",
            "persesDashboards.namespace=perses",
            "persesDashboards.instanceSelector.matchLabels.team=infra",
        ]
    )
    for d in by_kind(forced, "PersesDashboard"):
        assert d["metadata"]["namespace"] == "perses"
        assert d["spec"]["instanceSelector"] == {"matchLabels": {"team": "infra"}}


# --- two releases side by side ------------------------------------------------------------

# The migration runbook's pair (docs/runbook.md): the device-plugin release, narrowed to its
# pool, and a DRA release next to it, in one namespace, everything of the chart's monitoring on.
MONITORING = [
    "persesDashboards.enabled=true", "serviceMonitor.enabled=true", "prometheusRule.enabled=true",
    "forceMonitoringApi=true",
]  # fmt: skip
RELEASES = {
    DEFAULT: [*MONITORING, "nodeSelector.ate\\.dev/pool=device-plugin"],
    f"{DEFAULT}-dra": [*MONITORING, "dra.mode=dra", "nodeSelector.ate\\.dev/pool=dra"],
}


def node_links(dashboard: dict[str, Any]) -> list[str]:
    """The URLs of the Fleet's links to the Node dashboard."""
    text = json.dumps(dashboard)
    return re.findall(r'"url": "(/d/[^"]*)"', text)


def daemonset_constant(dashboard: dict[str, Any]) -> str:
    (constant,) = [v["query"] for v in dashboard["templating"]["list"] if v["name"] == "daemonset"]
    return str(constant)


def test_two_releases_render_side_by_side(any_helm: Helm) -> None:
    """No object of one replaces one of the other, and no dashboard either: Grafana's uids,
    titles and the sidecar's file names, Perses' names in their project; each Fleet links to
    its own Node dashboard and reads its own DaemonSet; the default release keeps the
    generated uids."""
    rendered = {release: any_helm.template(sets=sets, release=release) for release, sets in RELEASES.items()}
    objects = Counter(
        (d["apiVersion"], d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])
        for docs in rendered.values()
        for d in docs
    )
    assert [o for o, n in objects.items() if n > 1] == []
    boards = {release: grafana_dashboards(docs) for release, docs in rendered.items()}
    files = [name for shipped in boards.values() for name in shipped]
    assert len(files) == len(set(files)) == 4, "the sidecar writes each into one folder"
    for key in ("uid", "title"):
        values = [d[key] for shipped in boards.values() for d in shipped.values()]
        assert len(values) == len(set(values)) == 4, key
    perses = [
        (d["metadata"]["namespace"], d["metadata"]["name"])
        for docs in rendered.values()
        for d in by_kind(docs, "PersesDashboard")
    ]
    assert len(perses) == len(set(perses)) == 4
    assert {d["uid"] for d in boards[DEFAULT].values()} == {"ate-devplugin-fleet", "ate-devplugin-node"}
    for release, shipped in boards.items():
        fleet, node = shipped[f"{release}-fleet.json"], shipped[f"{release}-node.json"]
        assert (fleet["uid"], node["uid"]) == (f"{release}-fleet", f"{release}-node")
        assert fleet["title"] == f"{release} / Fleet"
        assert node_links(fleet)
        assert all(url.startswith(f"/d/{node['uid']}/") for url in node_links(fleet))
        assert fleet["links"][0]["tags"] == [release], "the dropdown lists the release's own"
        assert release in node["tags"]
        (daemonset,) = [d["metadata"]["name"] for d in daemonsets(rendered[release])]
        assert daemonset_constant(fleet) == daemonset
        (rule,) = by_kind(rendered[release], "PrometheusRule")
        missing = next(
            r for g in rule["spec"]["groups"] for r in g["rules"] if r.get("alert") == "AteDevpluginPodMissing"
        )
        assert f'created_by_name=~"{daemonset}"' in missing["expr"]


def test_long_release_names_get_grafana_uids_that_fit(any_helm: Helm) -> None:
    """Grafana refuses a uid over 40 characters: a long full name is cut, with a hash of it
    that keeps two long names that share a beginning apart."""
    uids = []
    for release in ("a-rather-long-release-name-for-devices-one", "a-rather-long-release-name-for-devices-two"):
        shipped = grafana_dashboards(any_helm.template(release=release))
        uids += [d["uid"] for d in shipped.values()]
        fleet = next(d for d in shipped.values() if d["uid"].endswith("-fleet"))
        assert fleet["title"] == f"{release}-ate-devplugin / Fleet"
    assert all(len(uid) <= 40 for uid in uids), uids
    assert len(set(uids)) == 4, uids
