"""Test doubles that ship with sandfleet: a scripted model server and synthetic traces.

- :mod:`sandfleet.testing.fake_server`: a scripted OpenAI-compatible HTTP server (tests, demos,
  ``sandfleet model-server``);
- :mod:`sandfleet.testing.hf_server`: a real small model (SmolLM2-135M on transformers, CPU)
  behind the same HTTP server, for the opt-in real-model suite (needs torch; imported lazily);
- :mod:`sandfleet.testing.synth`: hand-built traces, including the study's A and B runs.
"""
