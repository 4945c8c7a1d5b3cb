"""The packages under examples/ work as their READMEs say (the installed-wheel route runs in
.ci/release_check.sh; here the example's own metadata is laid out as pip would install it)."""

from __future__ import annotations

import contextlib
import io
import re
import sys
import tomllib
from pathlib import Path

import pytest
import torch

import lola
from lola import policies

PLUGIN = Path(__file__).resolve().parents[2] / "examples" / "unfamiliar-policy"


@pytest.fixture
def installed_example(tmp_path, monkeypatch):
    """The example's package and a dist-info of its entry points on sys.path, as `pip install` leaves them."""
    project = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]
    dist = tmp_path / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    groups = project["entry-points"]
    (dist / "entry_points.txt").write_text("".join(f"[{g}]\n" + "".join(f"{n} = {t}\n" for n, t in eps.items()) for g, eps in groups.items()))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(PLUGIN / "src"))
    yield project
    for name in groups.get("lola.policies", {}):
        policies.unregister(name)
    sys.modules.pop("lola_unfamiliar", None)


def test_the_plugin_is_found_by_name_and_its_readme_runs(installed_example):
    assert installed_example["entry-points"]["lola.policies"] == {"unfamiliar": "lola_unfamiliar:Unfamiliar"}
    assert "lola-attention>=0.1" in installed_example["dependencies"]  # the distribution's name, not the index's other "lola"
    policies.reload_entry_points()
    assert "unfamiliar" in policies.available()
    code = re.search(r"```python\n(.*?)```", (PLUGIN / "README.md").read_text(), flags=re.S).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "examples/unfamiliar-policy/README.md", "exec"), {})
    assert out.getvalue().splitlines()[0] == "Unfamiliar(eps=1e-06)"


def test_the_plugin_keeps_the_keys_the_state_knows_least(installed_example):
    # Two candidates: one a key the state has absorbed many times, one orthogonal to it.
    from lola.feature_maps import EluFeatureMap
    from lola.memory import KVBlock, LinearState
    from lola.policies import ScoringContext

    policies.reload_entry_points()
    policy = lola.policies.build("unfamiliar")
    phi = EluFeatureMap(1, 4)
    linear = LinearState()
    linear.allocate(1, 1, phi.feature_dim, 4, torch.device("cpu"))
    seen = torch.tensor([4.0, 0.0, 0.0, 0.0])
    linear.write(phi(seen.expand(1, 1, 20, 4)), torch.randn(1, 1, 20, 4), torch.ones(1, 1, 20, dtype=torch.bool))
    k = torch.stack([seen, torch.tensor([-4.0, 0.0, 0.0, 0.0])]).expand(1, 1, 2, 4)
    candidates = KVBlock(k=k, v=torch.randn(1, 1, 2, 4), pos=torch.arange(20, 22).expand(1, 1, 2))
    scores = policy.score(candidates, ScoringContext(linear=linear, feature_map_k=phi, num_heads=1, step=torch.tensor([21])))
    assert scores.shape == (1, 1, 2) and scores[0, 0, 1] > scores[0, 0, 0]
