"""The sandbox service: ``sandfleet serve`` runs on a CPU host and lets trainers elsewhere
create and drive its sandboxes over HTTP (docs/service.md); :mod:`sandfleet.client` is its
Python client.

- :mod:`.app` the FastAPI routes, auth, errors and NDJSON streaming;
- :mod:`.service` the sandboxes: ownership, TTLs, quota, journal, snapshots, sessions;
- :mod:`.admission` the two limits, their defaults from the host, the fair queue;
- :mod:`.auth` the token file; :mod:`.metrics` Prometheus; :mod:`.cli` the command;
- :mod:`.testing` a real service in a subprocess, for tests and ``bench service``.
"""
