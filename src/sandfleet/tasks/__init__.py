"""Task formats: Harbor (task.toml) and Terminal-Bench 1 (task.yaml), loaded into one model.

>>> from sandfleet.tasks import load_task
>>> task = load_task("examples/tasks/csv-awk-aggregate")  # doctest: +SKIP
"""

from sandfleet.tasks.loader import LoadFailure, detect_format, load_task, load_tasks
from sandfleet.tasks.model import PreparePlan, SolutionPlan, Task, TerminalCommand, Upload, VerifierPlan
from sandfleet.tasks.reward import Reward, reward_from

__all__ = [
    "LoadFailure",
    "PreparePlan",
    "Reward",
    "SolutionPlan",
    "Task",
    "TerminalCommand",
    "Upload",
    "VerifierPlan",
    "detect_format",
    "load_task",
    "load_tasks",
    "reward_from",
]
