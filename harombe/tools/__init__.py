"""Agent-facing tools built on the sandbox manager."""
