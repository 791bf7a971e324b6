"""Sandboxes, policy and approval.

Four rooms, each importing only from the ones below it::

    approval/   the HITL gate and approvers           (uses policy)
    runtime/    host side: Docker, sandboxes, runs    (uses policy)
    policy/     pure rules: risk, paths, allowlists   (uses nothing but config and errors)
    guest/      code that runs inside the sandbox     (imports nothing from harombe)

The usage guide's modules here (``docker_manager``, ``sandbox_manager``, ``hitl``,
``sandbox_risk``) are thin public faces over those rooms.
"""
