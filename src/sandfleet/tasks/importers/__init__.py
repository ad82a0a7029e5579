"""Importers of public suites into Harbor task folders, from installed PyPI packages, offline.

Each importer writes one task folder per problem (task.toml, instruction.md,
environment/Dockerfile, tests/test.sh writing /logs/verifier/reward.txt, solution/solve.sh,
SOURCE.md) and an IMPORT_REPORT.md listing what it wrote and what it skipped, and why.
"""

from sandfleet.tasks.importers.common import ImportResult, PackageMissingError
from sandfleet.tasks.importers.humaneval import import_humaneval
from sandfleet.tasks.importers.intercode_bash import import_intercode_bash

IMPORTERS = {"humaneval": import_humaneval, "intercode-bash": import_intercode_bash}

__all__ = [
    "IMPORTERS",
    "ImportResult",
    "PackageMissingError",
    "import_humaneval",
    "import_intercode_bash",
]
