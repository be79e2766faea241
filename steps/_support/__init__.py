"""What the step kinds share, and nothing else: it imports the contract (:mod:`steps.base`) and no engine code.

- ``process``: run a child process with output streaming, a timeout, cancellation and its process group.
- ``supervise``: the job file of a detached launch (pid, start time) and adopting a running job.
- ``readiness``: waiting until an HTTP or TCP endpoint answers (the ``wait`` kind, docker's ``wait:``).
- ``docker_engine``: connecting to a Docker Engine (unix, tcp+TLS, ssh) and naming it in errors.
- ``gitdir``: reading a ``.git`` directory without running git (HEAD, origin).
- ``files``: globs, ``creates`` checks and content digests.
- ``ray_jobs``: the Ray Jobs REST client of ``launch.ray``.
- ``faults``: named crash points for the reliability tests (``RUNNER_FAULT``); the engine and state use them too.
- ``hashing``: canonical JSON and its sha256, the one digest every fingerprint is made of.
"""
