"""Remove each disk weight push's folder once the servers have loaded a newer one.

Upstream behaviour (areal 1.0.4): every disk weight push writes the whole model to a new
folder, `weight_update_v<version>` beside the configured path
(`WeightUpdateMeta.with_version`), and nothing ever removes one. A run keeps a full copy of
the model on disk for every step it has taken, so a long run, or a large model's short one,
ends when its disk is full.

Effect: after a push has been loaded by the servers (`FSDPEngine._update_weights_from_disk`
returned on rank 0), the folders of older versions are removed; the newest stays, so a
server that restarts or a reader of the folder still finds the weights being served.
Checkpoints (`saver`, `recover`) are written elsewhere and are not touched.

Off: `areal_patches.install(push_cleanup=False)`.
"""

from __future__ import annotations

import functools
import os
import re
import shutil

PUSH_FOLDER = re.compile(r"weight_update_v(\d+)")


def older_push_folders(parent: str, version: int) -> list[str]:
    """The `weight_update_v<k>` folders in `parent` with k below `version`."""
    if not os.path.isdir(parent):
        return []
    return sorted(
        os.path.join(parent, name)
        for name in os.listdir(parent)
        if (match := PUSH_FOLDER.fullmatch(name)) and int(match.group(1)) < version
    )


def install() -> None:
    import torch.distributed as dist
    from areal.engine.fsdp_engine import FSDPEngine

    original = FSDPEngine._update_weights_from_disk
    if getattr(original, "removes_older_pushes", False):
        return

    @functools.wraps(original)
    def _update_weights_from_disk(self, meta) -> None:
        original(self, meta)
        if dist.get_rank() == 0 and meta.path is not None and meta.version is not None:
            for folder in older_push_folders(os.path.dirname(meta.path), meta.version):
                shutil.rmtree(folder, ignore_errors=True)

    _update_weights_from_disk.removes_older_pushes = True
    FSDPEngine._update_weights_from_disk = _update_weights_from_disk
