"""Everything on the host that drives sandboxes: the Docker backend, container start-up,
runs, files, package installs, the warm pool, networks and the egress proxy.

The Docker backend (:mod:`.docker`) is the only code that talks to Docker. Public faces:
:mod:`harombe.security.docker_manager` and :mod:`harombe.security.sandbox_manager`.
"""
