"""`pip install .` (not editable) ships the recipes, cluster profiles and templates and works outside the checkout."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import REPO


def test_wheel_ships_data_and_works_outside_the_checkout(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "dist"), str(REPO)], check=True, timeout=300)
    wheel = next((tmp_path / "dist").glob("hpc_grpo-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for kind in ("recipes", "clusters", "templates"):
        shipped = {Path(n).name for n in names if n.startswith(f"hpc_grpo/_shipped/{kind}/")}
        assert shipped == {p.name for p in (REPO / kind).iterdir() if p.is_file()}, kind
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = ("import json, hpc_grpo.config.registry as r; "
             "print(json.dumps([r.list_names('recipes'), str(r.template_dir()), str(r.find('clusters', 'local'))]))")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    recipes, templates, local = json.loads(proc.stdout)
    assert "qwen2.5-7b-codegen" in recipes
    assert templates.startswith(str(site)) and local.startswith(str(site))
