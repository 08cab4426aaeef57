import subprocess
import sys

HEAVY = ("torch", "transformers", "trl", "peft", "datasets")


def test_the_daemon_never_imports_the_training_stack() -> None:
    """The parent stays small and starts fast: torch and TRL load only in the child process."""
    code = (
        "import sys, daemon.cli, daemon.service, daemon.job, daemon.hub_push, daemon.demo, schemas; "
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_schemas_depend_on_pydantic_only() -> None:
    code = "import sys, schemas, schemas.jsonschema; print(sorted(m for m in ('aiokafka', 'structlog', 'huggingface_hub', 'daemon') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
