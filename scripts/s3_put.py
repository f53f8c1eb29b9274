"""Upload a local folder to an S3 prefix (same layout), creating the buckets when missing:
`python scripts/s3_put.py FOLDER s3://bucket/prefix [--bucket other ...]`. The store comes
from the AWS environment (AWS_ENDPOINT_URL, ...), as for the job itself."""

from __future__ import annotations

import argparse
from pathlib import Path

from reassembler import storage


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    p.add_argument("uri")
    p.add_argument("--bucket", action="append", default=[], help="another bucket to create (an output's)")
    args = p.parse_args()
    client = storage.s3.client()
    bucket, _, prefix = args.uri[len("s3://") :].partition("/")
    for name in [bucket, *args.bucket]:
        try:
            client.head_bucket(Bucket=name)
        except Exception:  # noqa: BLE001 - missing: make it
            client.create_bucket(Bucket=name)
    n = 0
    for path in sorted(args.folder.rglob("*")):
        if path.is_file():
            storage.write_bytes(storage.join(args.uri, path.relative_to(args.folder).as_posix()), path.read_bytes())
            n += 1
    print(f"{n} files from {args.folder} to {args.uri}")


if __name__ == "__main__":
    main()
