import mmap
import os

import posix_ipc
import pytest


@pytest.fixture
def shm_object():
    """Makes POSIX shared-memory objects as a client (or the front) would: make(size) gives
    (name, a mapping of it, its identity [st_dev, st_ino]); each is unlinked afterwards."""
    made = []

    def make(size: int):
        name = f"/shmtest_{os.getpid()}_{len(made)}"
        shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=size)
        mapping = mmap.mmap(shm.fd, size)
        st = os.fstat(shm.fd)
        shm.close_fd()
        made.append((name, mapping))
        return name, mapping, [st.st_dev, st.st_ino]

    yield make
    for name, mapping in made:
        mapping.close()
        try:
            posix_ipc.unlink_shared_memory(name)
        except posix_ipc.ExistentialError:
            pass  # the test unlinked it
