"""The dashboards' chart values: editable, the Grafana sidecar's folder annotation, and the
PersesDashboard objects (perses-operator) for the Perses twins of the Grafana dashboards."""

from __future__ import annotations

import json
from typing import Any

import yaml

from tests.harness.chart import REPO, Helm, Manifest, by_kind

PERSES = sorted((REPO / "dashboards" / "perses").glob("*.json"))
PERSES_API = "perses.dev/v1alpha2/PersesDashboard"


def grafana_dashboards(docs: list[Manifest]) -> dict[str, Any]:
    maps = [d for d in by_kind(docs, "ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]]
    return {name: json.loads(text) for cm in maps for name, text in cm["data"].items()}


def test_dashboards_are_not_editable_unless_asked(helm: Helm) -> None:
    shipped = grafana_dashboards(helm.template())
    assert shipped
    for name, dashboard in shipped.items():
        assert dashboard == json.loads((REPO / "dashboards" / name).read_text()), "shipped as generated"
        assert dashboard["editable"] is False
    editable = grafana_dashboards(helm.template(sets=["dashboards.editable=true"]))
    assert set(editable) == set(shipped)
    for name, dashboard in editable.items():
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
    docs = helm.template(sets=["persesDashboards.enabled=true"], api_versions=[PERSES_API])
    objects = {d["metadata"]["name"]: d for d in by_kind(docs, "PersesDashboard")}
    assert len(objects) == len(PERSES) == 2
    generated = {
        d["metadata"]["name"]: d for d in yaml.safe_load_all((PERSES[0].parent / "persesdashboards.yaml").read_text())
    }
    for path in PERSES:
        dashboard = json.loads(path.read_text())
        got = objects[dashboard["metadata"]["name"]]
        assert got["apiVersion"] == "perses.dev/v1alpha2"
        assert got["metadata"]["namespace"] == "ate-system", "the release namespace: the Perses project"
        assert got["spec"] == {"config": dashboard["spec"]}
        assert got["spec"] == generated[dashboard["metadata"]["name"]]["spec"], "as dashboards/generate.py writes them"
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
