"""The differential install tier (tests/popular_charts.py): kube-prometheus-stack (ten prometheus-operator CRDs: a file of its own)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fleetlab import Lab
from tests.popular_charts import PARTS, install_both
from tests.popular_charts import chart_repo as chart_repo  # the fixture
from tests.realenv.helm import StaticFiles
from tests.realenv.kube import Cluster
from tests.test_crds import crds as crds  # the fixture: the CRDs installed

pytestmark = pytest.mark.charts


@pytest.mark.parametrize("name", PARTS["test_popular_charts_kube_prometheus_stack"])
def test_chart_installs_through_hub_and_agent_as_helm_installs_it(
    name: str, lab: Lab, crds: Cluster, namespace: str, tmp_path: Path, chart_repo: StaticFiles
) -> None:
    install_both(name, lab, crds, namespace, tmp_path, chart_repo)
