"""Images a Python call displays, for the Python session worker (standard library only).

A part of ``PY_WORKER_SOURCE`` (see ``__init__.py``), before ``pyworker.py``, which calls
:func:`install_display_hooks` once and :func:`collect_open_figures`, :func:`image_of_value`
and :meth:`_Images.reply_fields` in each call. Nothing here imports matplotlib or PIL: only
modules the user's code already imported are used, so code that draws nothing pays nothing.

- matplotlib: the worker's environment says ``MPLBACKEND=Agg`` (no display in a sandbox)
  unless the user's environment names a backend, and a finder at the head of ``sys.meta_path``
  replaces ``matplotlib.pyplot.show`` as soon as pyplot is imported: ``plt.show()`` renders
  every open figure to PNG and closes it. Figures still open when the call ends are rendered
  and closed the same way, so a figure is sent once.
- PIL: an ``Image`` that is the call's final expression is sent as PNG too (its repr stays in
  ``result``).

The images go after the held stdout in the reply's blob, listed in the reply as
``artifacts: [[source, size], ...]``; ``artifact_notes`` says what could not be sent (an image
that failed to render, or one past :data:`MAX_ARTIFACT_BYTES` for the call).
"""

import io
import os
import sys

MAX_ARTIFACT_NOTES = 8
ARTIFACT_NOTE_CHARS = 300


class _Images:
    """The PNG images of the current call, within the per-call cap."""

    def __init__(self):
        self.items = []
        self.size_bytes = 0
        self.notes = []

    def note(self, text):
        if len(self.notes) < MAX_ARTIFACT_NOTES:
            self.notes.append(text[:ARTIFACT_NOTE_CHARS])

    def add(self, source, render):
        """Render one image with ``render()`` (PNG bytes) and keep it if it fits the cap."""
        try:
            data = render()
        except BaseException as exc:  # a timeout's KeyboardInterrupt too: the reply must go
            self.note("%s was not sent: rendering it as PNG failed (%s: %s)"
                      % (source, type(exc).__name__, exc))  # fmt: skip
            return
        if self.size_bytes + len(data) > MAX_ARTIFACT_BYTES:
            self.note("%s was not sent: the call's images would exceed %d bytes"
                      % (source, MAX_ARTIFACT_BYTES))  # fmt: skip
            return
        if data and len(self.items) < 64:
            self.items.append((source, data))
            self.size_bytes += len(data)

    def reply_fields(self, reply):
        """Put the images' list and notes into ``reply``; return their bytes (for the blob)
        and start afresh for the next call."""
        blob = b"".join(data for _, data in self.items)
        if self.items:
            reply["artifacts"] = [[source, len(data)] for source, data in self.items]
        if self.notes:
            reply["artifact_notes"] = self.notes
        self.__init__()
        return blob


IMAGES = _Images()


def _png(save):
    buffer = io.BytesIO()
    save(buffer, format="png")
    return buffer.getvalue()


def collect_open_figures():
    """Render every open pyplot figure as PNG and close it (nothing if pyplot is not loaded)."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    try:
        for num in pyplot.get_fignums():
            figure = pyplot.figure(num)
            IMAGES.add("matplotlib figure %s" % (num,), lambda f=figure: _png(f.savefig))
            pyplot.close(figure)
    except BaseException as exc:  # the user's pyplot is theirs: it must not take the worker
        IMAGES.note("open figures were not sent (%s: %s)" % (type(exc).__name__, exc))


def show(*_args, **_kwargs):
    """``matplotlib.pyplot.show`` in the sandbox: the open figures become images of the call."""
    collect_open_figures()


def image_of_value(value):
    """Send ``value`` as PNG if it is a PIL image (PIL already imported by the code)."""
    pil = sys.modules.get("PIL.Image")
    cls = getattr(pil, "Image", None) if pil is not None else None
    if not isinstance(cls, type) or not isinstance(value, cls):
        return

    def render():
        try:
            return _png(value.save)
        except OSError:  # a mode PNG cannot hold (CMYK, say): as RGBA
            return _png(value.convert("RGBA").save)

    IMAGES.add("final expression", render)


class _ShowingLoader:
    """pyplot's own loader, then :func:`show` in place of pyplot's."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        module.show = show

    def __getattr__(self, name):
        return getattr(self.loader, name)


class _PyplotFinder:
    """Finds ``matplotlib.pyplot`` through the other finders and hooks its loader; says
    nothing about any other module."""

    def find_spec(self, name, path=None, target=None):
        if name != "matplotlib.pyplot":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ShowingLoader(spec.loader)
                return spec
        return None


def install_display_hooks():
    """Once per worker, before any user code: Agg by default, and the pyplot finder."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    sys.meta_path.insert(0, _PyplotFinder())
