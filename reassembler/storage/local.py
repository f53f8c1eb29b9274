"""The local store: listing that skips nothing silently, atomic writes, hard-linked copies.

Locally a file is written whole under a temporary name and renamed into place, so a reader
sees the old content or the new, never a part; a copy is a hard link (files here are never
changed in place).
"""

from __future__ import annotations

import os
import shutil
import stat
import threading

from ..errors import InputError


def list_files(part: str, suffix, recursive: bool, exclude: str | None) -> list[str]:
    """Sorted relative paths of the files ending in `suffix` under `part` (none when it is
    not a folder). Links are followed; a dangling link, an unreadable entry, a link loop, or
    anything but a file or folder (a named pipe, a socket, a device: reading it could block)
    is an InputError naming it."""
    if not os.path.isdir(part):
        return []  # as a prefix holding no object
    found: list[str] = []
    seen: set[tuple[int, int]] = set()

    def visit(folder: str, rel: str) -> None:
        st = os.stat(folder)
        if (st.st_dev, st.st_ino) in seen:
            raise InputError(f"{folder}: symbolic link loop (this folder is reached twice)")
        seen.add((st.st_dev, st.st_ino))
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as e:
            raise InputError(f"{folder}: cannot list the folder ({e.strerror})") from e
        for entry in entries:
            name = f"{rel}{entry.name}"
            full = os.path.join(folder, entry.name)
            try:
                entry.name.encode("utf-8")
            except UnicodeEncodeError:  # undecodable bytes, kept by Python as lone surrogates
                raise InputError(f"{folder}: the name {ascii(entry.name)} is not valid UTF-8; rename it") from None
            try:
                is_dir, is_file = entry.is_dir(), entry.is_file()
            except OSError as e:
                raise InputError(f"{full}: cannot read ({e.strerror})") from e
            if not (is_dir or is_file):
                try:
                    mode = os.stat(entry.path).st_mode
                except FileNotFoundError:
                    if not (entry.name.endswith(suffix) or recursive):
                        continue  # a link that would not be read either way
                    raise InputError(f"{full}: dangling symbolic link (points to {os.readlink(entry.path)})") from None
                except OSError as e:
                    raise InputError(f"{full}: cannot read ({e.strerror})") from e
                # a FIFO, socket or device: reading it could block or never end
                raise InputError(f"{full}: not a regular file ({_kind(mode)}); only files are read")
            if is_dir:
                if recursive:
                    visit(entry.path, name + "/")
            elif is_file and entry.name.endswith(suffix) and not (exclude and entry.name.endswith(exclude)):
                if not os.access(entry.path, os.R_OK):
                    raise InputError(f"{full}: file is not readable")
                found.append(name)

    visit(part, "")
    return sorted(found)


def _kind(mode: int) -> str:
    for test, label in (
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return label
    return "not a file or folder"


def write_bytes(loc: str, data: bytes) -> None:
    """Write `loc` whole, atomically (a temporary file renamed into place)."""
    os.makedirs(os.path.dirname(loc), exist_ok=True)
    tmp = f"{os.path.dirname(loc)}/.{os.path.basename(loc)}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.rename(tmp, loc)


def copy(src: str, dst: str) -> None:
    """A hard link (a copy where the filesystem has none)."""
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    try:
        os.link(src, dst)
    except FileExistsError:
        os.unlink(dst)
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def delete(loc: str) -> None:
    try:
        os.unlink(loc)
    except FileNotFoundError:
        pass
