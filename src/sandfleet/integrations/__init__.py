"""sandfleet inside the tools agent and RL teams already run, through each tool's own
extension point and without patching the tool (docs/integrations.md).

One module per tool; nothing here is imported by ``import sandfleet``, and no module
imports its tool at import time unless it subclasses one of the tool's classes:

- :mod:`sandfleet.integrations.miles`: Miles' ``--custom-agent-function-path`` (``run``,
  ``abort``, ``custom_rm``), sandfleet's agent loop under Miles' session-server rules;
- :mod:`sandfleet.integrations.slime`: slime's ``Sandbox`` protocol (``SandfleetSandbox``)
  and a ``--custom-generate-function-path`` function for whole agentic rollouts;
- :mod:`sandfleet.integrations.minisweagent`: ``SandfleetEnvironment`` for mini-swe-agent's
  ``--environment-class`` (extra ``minisweagent``);
- :mod:`sandfleet.integrations.verl`: ``SandfleetCodeInterpreterTool``, a verl ``BaseTool``
  with stateful Python per trajectory (the code interpreter's kernel in a sandbox);
- :mod:`sandfleet.integrations.verl_tree`: branched groups in verl (an agent loop, its manager
  and the ``sandfleet_tree`` advantage estimator; ``--branch``);
- :mod:`sandfleet.integrations.harbor`: ``SandfleetEnvironment``, a Harbor ``BaseEnvironment``
  for ``harbor run -e sandfleet.integrations.harbor:SandfleetEnvironment`` (extra ``harbor``,
  Python 3.12 or later).

What they share (task lookup, one rollout, the process's live sandboxes, the session-rules
agent loop, the trainer's model token by token and groups of trees grown with it) is in
``_common``, ``_session`` and ``_tokens``.
"""
