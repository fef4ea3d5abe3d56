"""What two versions' manifests share and where they differ."""

from __future__ import annotations

from modelstate.schemas import FileChange, ManifestDiff, Version


def diff_versions(a: Version, b: Version) -> ManifestDiff:
    old = {f.path: f for f in a.files}
    new = {f.path: f for f in b.files}
    stored_in_a = {f.sha256 for f in a.files}
    return ManifestDiff(
        job_id=b.job_id,
        a=a.number,
        b=b.number,
        added=[new[p] for p in sorted(new.keys() - old.keys())],
        removed=[old[p] for p in sorted(old.keys() - new.keys())],
        changed=[
            FileChange(path=p, a=old[p], b=new[p])
            for p in sorted(old.keys() & new.keys())
            if old[p].sha256 != new[p].sha256
        ],
        unchanged=sorted(p for p in old.keys() & new.keys() if old[p].sha256 == new[p].sha256),
        shared_bytes=sum(f.size for f in b.files if f.sha256 in stored_in_a),
    )
