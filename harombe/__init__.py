"""harombe: run LLM-written code in gVisor sandboxes, behind a human-in-the-loop risk gate."""

__version__ = "0.1.0"
