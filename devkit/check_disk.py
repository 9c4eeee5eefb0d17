"""Stop `make` before the install if the disk cannot hold it.

A full disk halfway through `pip install` leaves a broken `.venv` and an OSError deep in
pip's output; this says up front how much room is needed and where.
"""

import shutil
import sys

NEEDED_GIB = 6.0


def main(path: str) -> None:
    free_gib = shutil.disk_usage(path).free / 2**30
    if free_gib < NEEDED_GIB:
        sys.exit(
            f"check_disk: {free_gib:.1f} GiB free on the disk holding {path!r}; installing "
            "requirements-cpu.txt (areal 1.0.4 with a CPU build of torch) needs about "
            f"{NEEDED_GIB:.0f} GiB there (and in TMPDIR if that is another disk). Free some "
            "space and run make again."
        )
    print(f"check_disk: {free_gib:.1f} GiB free, enough for the install")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
