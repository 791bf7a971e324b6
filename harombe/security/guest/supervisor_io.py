"""An epoll selector and the frame writer for the in-sandbox supervisor, without costly imports.

The second part of the supervisor's source, after ``wire.py`` (see ``__init__.py``). Under
gVisor every module a fresh interpreter imports is read through the gofer, and ``selectors``
(which pulls in ``collections.abc``) adds to every cold start: ``select.epoll`` does the
waiting, behind the few methods of ``selectors`` the supervisor uses.
"""

import os
import select

EVENT_READ = 1
EVENT_WRITE = 2


def send(msg, blob=b""):
    """Write one frame to the host (stdout, non-blocking): waits while the pipe is full."""
    view = memoryview(encode(msg, blob))
    while view:
        try:
            n = os.write(1, view)
        except InterruptedError:
            continue
        except BlockingIOError:
            select.select([], [1], [])
            continue
        view = view[n:]


class _Key:
    __slots__ = ("fd", "events", "data")

    def __init__(self, fd, events, data):
        self.fd = fd
        self.events = events
        self.data = data


class Selector:
    """The subset of ``selectors.EpollSelector`` the supervisor uses."""

    def __init__(self):
        self._epoll = select.epoll()
        self._keys = {}

    def register(self, fd, events, data=None):
        if fd in self._keys:
            raise KeyError("fd %d is already registered" % fd)
        mask = (select.EPOLLIN if events & EVENT_READ else 0) | (
            select.EPOLLOUT if events & EVENT_WRITE else 0
        )
        self._epoll.register(fd, mask)
        self._keys[fd] = _Key(fd, events, data)

    def unregister(self, fd):
        key = self._keys.pop(fd)  # KeyError when not registered, as selectors does
        try:
            self._epoll.unregister(fd)
        except (OSError, ValueError):
            pass
        return key

    def select(self, timeout=None):
        try:
            ready = self._epoll.poll(-1 if timeout is None else max(timeout, 0))
        except InterruptedError:
            return []
        events = []
        for fd, mask in ready:
            key = self._keys.get(fd)
            if key is not None:
                got = (
                    EVENT_READ if mask & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR) else 0
                ) | (
                    EVENT_WRITE
                    if mask & (select.EPOLLOUT | select.EPOLLHUP | select.EPOLLERR)
                    else 0
                )
                if got & key.events:
                    events.append((key, got & key.events))
        return events
