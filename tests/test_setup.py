"""The set-up that `make demo` and `make test` run on a fresh machine."""

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent


def test_torch_installed_first_is_the_one_areal_resolves_to():
    """The Makefile installs requirements.txt's torch pin alone, before areal. A pin outside
    areal's range would make pip replace it in the second step (another 4.5 GB of wheels)."""
    pins = dict(re.findall(r"^(\w+)==(\S+)$", (ROOT / "requirements.txt").read_text(), re.M))
    areal_requirements = map(Requirement, importlib.metadata.requires("areal"))
    areal_torch = next(r for r in areal_requirements if r.name == "torch" and (r.marker is None or r.marker.evaluate()))
    assert areal_torch.specifier.contains(pins["torch"])
    assert importlib.metadata.version("torch").split("+")[0] == pins["torch"]
    assert "grep -E '^torch==' requirements.txt" in (ROOT / "Makefile").read_text()


def run_check_disk(needed_gib: float) -> subprocess.CompletedProcess:
    code = (
        "import sys; sys.path.insert(0, 'scripts'); import check_disk; "
        f"check_disk.NEEDED_GIB = {needed_gib}; check_disk.main('.')"
    )
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)


def test_check_disk_stops_make_with_how_much_room_is_needed_and_where():
    short = run_check_disk(needed_gib=1e9)
    assert short.returncode == 1
    assert "GiB free on the disk holding '.'" in short.stderr
    assert "needs about 1000000000 GiB there" in short.stderr
    enough = run_check_disk(needed_gib=0.001)
    assert enough.returncode == 0
    assert "enough for the install" in enough.stdout
