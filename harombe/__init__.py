"""harombe: run LLM-written code in gVisor sandboxes, behind a human-in-the-loop risk gate."""

__version__ = "0.1.0"

from harombe import logs as _logs

_logs.ensure_configured()  # events to stderr at info, unless structlog is configured already
