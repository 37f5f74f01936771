"""helm, built from its Go module, renders charts for the test cluster's Kubernetes version."""

from __future__ import annotations

import subprocess

import pytest

from tests.cluster.harness import BIN

pytestmark = pytest.mark.integration


def test_helm_template_sees_the_cluster_kubernetes_version(tmp_path, cluster):
    chart = tmp_path / "probe"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(
        "apiVersion: v2\nname: probe\nversion: 0.1.0\nkubeVersion: '>= 1.30.0-0'\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: probe}\n"
        "data: {kube: '{{ .Capabilities.KubeVersion.Version }}'}\n")
    # Offline rendering must not assume Kubernetes 1.20 (helm's default without its ldflags).
    offline = subprocess.run([str(BIN / "helm"), "template", "probe", str(chart)],
                             capture_output=True, text=True, check=True)
    assert "kube: 'v1.36" in offline.stdout
    # Against the live cluster the version comes from its /version.
    live = subprocess.run([str(BIN / "helm"), "template", "probe", str(chart), "--validate",
                           f"--kubeconfig={cluster.kubeconfig}"],
                          capture_output=True, text=True, check=True)
    assert "kube: 'v1.36.3'" in live.stdout
