"""The package as a registry would show it: the wheel carries the LICENSE and names the
repository, and the README (the package's page) links only to absolute URLs, which work from
the registry page (relative `../../` links do not)."""

import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
REPOSITORY = "https://github.com/switchboard-agents/switchboard"


def test_the_wheel_has_the_license_and_the_repository(tmp_path):
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        "__pycache__", "build", "*.egg-info", ".pytest_cache"))
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("switchboard_agents-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        licenses = [n for n in names if n.endswith("LICENSE") and ".dist-info/" in n]
        assert licenses, names
        assert "Apache License" in archive.read(licenses[0]).decode()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
    metadata = metadata.decode()
    assert f"Project-URL: Repository, {REPOSITORY}" in metadata, metadata[:2000]
    assert "Apache-2.0" in metadata


def test_the_readme_links_work_from_the_registry_page():
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)]+)\)", readme)
    assert targets
    relative = [t for t in targets if not re.match(r"https?://", t)]
    assert relative == [], relative
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
