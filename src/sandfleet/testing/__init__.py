"""Test doubles that ship with sandfleet: a scripted model server and synthetic traces.

- :mod:`sandfleet.testing.fake_server`: a scripted OpenAI-compatible HTTP server (tests, demos,
  ``sandfleet model-server``);
- :mod:`sandfleet.testing.synth`: hand-built traces, including the study's A and B runs.
"""
