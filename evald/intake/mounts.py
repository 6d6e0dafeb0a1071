"""Is a directory on a shared filesystem, where inotify misses other hosts' writes?"""

from __future__ import annotations

import os
from pathlib import Path

# inotify sees only this kernel's writes: on these, watchdog's PollingObserver is needed.
SHARED_FS_TYPES = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "ceph", "beegfs", "9p",
                   "glusterfs", "afs")


def filesystem_type(path: Path, mounts_file: str = "/proc/mounts") -> str | None:
    """The type of the filesystem holding ``path`` (longest matching mount point)."""
    target = os.path.realpath(path)
    best, best_type = "", None
    try:
        with open(mounts_file, encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mount_point = parts[1].replace("\\040", " ")
                if (target == mount_point or target.startswith(mount_point.rstrip("/") + "/")) \
                        and len(mount_point) > len(best):
                    best, best_type = mount_point, parts[2]
    except OSError:
        return None
    return best_type


def needs_polling(fs_type: str | None) -> bool:
    if fs_type is None:
        return False
    return fs_type in SHARED_FS_TYPES or fs_type.startswith("fuse")
