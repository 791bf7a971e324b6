"""The human-in-the-loop gate and the approvers it calls.

The gate classifies an operation with :mod:`harombe.security.policy` and asks an injected
approver (a callback); it never prompts a terminal itself. Public face:
:mod:`harombe.security.hitl`.
"""
