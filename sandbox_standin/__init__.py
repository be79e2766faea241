"""A small E2B-compatible server for rehearsals and tests. It is NOT a sandbox.

It speaks the subset of the E2B wire that the e2b SDK (2.45-2.63) uses to create a sandbox, run a command in
it and kill it, plus AgentENV's `GET /health` and `X-API-Key` check. Commands run as ordinary processes on this
host, in a scratch directory per "sandbox", with the server's own rights: use it on loopback, for rehearsals,
never for untrusted code. `python -m sandbox_standin --help` says how to start it.
"""
