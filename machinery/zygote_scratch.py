"""The scratch dirs and the private /dev/shm: made for a slot or a session, wiped after every execution.

Apart because wiping what the code left is its own problem: the code can build a tree thousands of levels deep
or make its folders unreadable, and a failed wipe must never break the zygote (_rmtree). The pool uses _rmtree
too, for the fallback's scratch root.
"""
import os
import stat
import time

from machinery.zygote_state import _Zygote


def _make_scratch(path: str, uid: int | None) -> None:
    os.makedirs(path, mode=0o700, exist_ok=True)
    if uid is not None:
        os.chown(path, uid, uid)


def _wipe_scratch(path: str, uid: int | None) -> None:
    with os.scandir(path) as it:
        if next(it, None) is None:
            return
    _rmtree(path)
    if os.path.exists(path):  # something undeletable: leave it and start a new dir
        os.rename(path, f"{path}.trash{time.monotonic_ns()}")
    _make_scratch(path, uid)


def _rmtree(path: str) -> None:
    """shutil.rmtree(path, ignore_errors=True) without recursion, and with paths of one name only.

    The code can build a tree thousands of levels deep (mkdir + chdir in a loop): shutil's recursion then
    raises RecursionError, which would leave a worker that answers every later call with an internal
    error, and the tree's full paths outgrow PATH_MAX. This walks down and up with directory fds (one open
    at a time). Best effort, like ignore_errors: what cannot be removed stays, and the caller checks."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    stuck: set = set()  # (st_dev, st_ino) of directories that could not be entered or removed
    down: list = []  # (name, key) of the directories we are inside, below path
    while True:
        sub = None
        try:
            names = os.listdir(fd)
        except OSError:
            names = []
        for name in names:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode):  # not a directory: unlink it
                try:
                    os.unlink(name, dir_fd=fd)
                except OSError:
                    pass
            elif (st.st_dev, st.st_ino) not in stuck:
                sub = (name, (st.st_dev, st.st_ino))
                break
        if sub is not None:
            try:
                os.chmod(sub[0], 0o700, dir_fd=fd)  # a directory the code made unreadable (0o000)
            except OSError:
                pass
            try:
                inner = os.open(sub[0], flags, dir_fd=fd)
            except OSError:
                stuck.add(sub[1])
                continue
            os.close(fd)
            fd = inner
            down.append(sub)
            continue
        if not down:
            break
        try:
            parent = os.open("..", flags, dir_fd=fd)
        except OSError:
            break
        finally:
            os.close(fd)
        fd = parent
        name, key = down.pop()
        try:
            os.rmdir(name, dir_fd=fd)
        except OSError:
            stuck.add(key)
    if down:  # lost our way up ("..": cannot happen unless the tree moves under us); the caller checks
        return
    os.close(fd)
    try:
        os.rmdir(path)
    except OSError:
        pass


def _wipe_shm(z: _Zygote) -> None:
    """Our own /dev/shm (bwrap, mountns) must not carry anything from one execution to the next."""
    if not z.private_shm:
        return
    with os.scandir("/dev/shm") as it:
        for entry in it:
            if entry.is_dir(follow_symlinks=False):
                _rmtree(entry.path)
            else:
                os.unlink(entry.path)
