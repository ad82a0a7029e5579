"""``sandfleet run``: rollouts of a task suite, with a live progress bar and a summary."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from sandfleet.cli.progress import progress as _progress
from sandfleet.cli.where import Where, dispatch, ray_option, refuse, remote_option
from sandfleet.rollout.policy import Policy
from sandfleet.rollout.result import RolloutResult
from sandfleet.sandbox.registry import choices as backend_choices
from sandfleet.settings import current as current_settings
from sandfleet.settings import install
from sandfleet.traceschema import SPAN_NAMES

if TYPE_CHECKING:
    from sandfleet.rollout.suite import RunConfig, RunReport
    from sandfleet.tasks.model import Task

AGENTS = ("oracle", "noop", "openai")


def make_policy(
    agent: str,
    *,
    model_url: str | None = None,
    model: str | None = None,
    api_key_env: str = "OPENAI_API_KEY",
    max_turns: int = 30,
    tool_mode: str = "auto",
) -> Policy:
    """A policy by name (``oracle``, ``noop``, ``openai``)."""
    from sandfleet.rollout.policy import NoopPolicy, OraclePolicy

    if agent == "oracle":
        return OraclePolicy()
    if agent == "noop":
        return NoopPolicy()
    from sandfleet.rollout.loop import AgentConfig, OpenAIPolicy

    if not model_url:
        raise click.UsageError("--agent openai needs --model-url (an OpenAI-compatible server)")
    config = AgentConfig(max_turns=max_turns, tool_mode=tool_mode)  # type: ignore[arg-type]
    return OpenAIPolicy(model_url, model or "default", api_key_env=api_key_env, config=config)


def check_model_url(url: str) -> None:
    """Refuse a ``--model-url`` nothing answers at, in one line, before any rollout (else every
    rollout would fail on it, each a policy error). Any HTTP answer to ``GET <url>/v1/models``,
    even 401 or 404, is a server: only a transport failure is refused."""
    import httpx

    from sandfleet.rollout.chat import _tls

    base = url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    try:
        with httpx.Client(verify=_tls() if base.startswith("https:") else False,
                          timeout=httpx.Timeout(10.0, connect=5.0)) as http:
            http.get(f"{base}/models")
    except httpx.TransportError as e:
        raise click.ClickException(f"--model-url {url}: nothing answers there ({type(e).__name__}: {e}); "
                                   "no rollout was started") from None
    except httpx.InvalidURL as e:
        raise click.BadParameter(str(e), param_hint="--model-url") from None


def summary_table(summary: dict[str, Any]) -> str:
    """The final table: pass rate, mean reward, throughput, mean seconds per span."""
    mean_reward = summary["mean_reward"]
    rows = [
        ("rollouts", f"{summary['n_rollouts']} ({summary['n_completed']} completed, "
                     f"{summary['n_failed']} failed, {summary['n_cancelled']} cancelled)"),
        ("verdicts", ", ".join(f"{v} {k}" for k, v in summary["verdicts"].items())),
        ("pass rate", f"{summary['pass_rate']:.1%} (of scored and policy_fault)"),
        ("mask rate", f"{summary['mask_rate']:.1%} (infra_fault, reward null)"),
        ("mean reward", "-" if mean_reward is None else f"{mean_reward:.3f}"),
        ("wall time", f"{summary['wall_s']:.1f} s"),
        ("rollouts/min", f"{summary['rollouts_per_min'] or 0:.1f}"),
        ("mean rollout", f"{summary['mean_rollout_s'] or 0:.2f} s"),
    ]  # fmt: skip
    for name in SPAN_NAMES:
        rows.append((f"  {name}", f"{summary['spans_mean_s'][name]:.3f} s"))
    if summary["overhead_fraction"] is not None:
        rows.append(("overhead fraction", f"{summary['overhead_fraction']:.3%}"))
    for reason, count in sorted(summary["failures"].items()):
        rows.append((f"failed: {reason}", str(count)))
    for cause, count in sorted(summary["masked_causes"].items()):
        rows.append((f"masked: {cause}", str(count)))
    for cause, count in sorted(summary.get("policy_fault_causes", {}).items()):
        rows.append((f"policy fault: {cause}", str(count)))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


@click.command("run")
@click.option(
    "--tasks",
    "tasks_dir",
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="A task folder, or a folder of task folders.",
)
@click.option("--agent", type=click.Choice(AGENTS), default="oracle", show_default=True)
@click.option("--model-url", help="Base URL of an OpenAI-compatible server (agent openai).")
@click.option("--model", help="Model name sent to the server (agent openai).")
@click.option(
    "--api-key-env",
    default="OPENAI_API_KEY",
    show_default=True,
    help="Environment variable holding the API key, if any.",
)
@click.option("-n", "n", default=1, show_default=True, type=int, help="Rollouts per task (group).")
@click.option("--concurrency", "concurrency_opt", default="auto", show_default=True,
              help="Rollouts in flight at once; at least -n (a group's rollouts are admitted together). "
              "auto: as many sandboxes as this host's CPUs hold at the tasks' declared cpus (at least -n); a "
              "larger number is allowed with a warning (the capacity benchmark tells how many more a host holds).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--backend", type=click.Choice(backend_choices()), default="auto",
              show_default=True)
@click.option("--no-limits", is_flag=True,
              help="Run sandboxes without cpu, memory and pids limits where cgroups are unusable (else refused).")
@click.option("--resume", is_flag=True, help="OUT holds an unfinished run: keep its finished groups, run the rest.")
@click.option("--overwrite", is_flag=True, help="OUT holds an earlier run: replace it.")
@click.option("--image", "image", default=None,
              help="Run every task in this image instead of building its own (e.g. host, for the process "
              "backend in development).")
@click.option("--task", "only", multiple=True, help="Run only these tasks (repeatable).")
@click.option("--fork/--no-fork", default=False,
              help="Run each group's prepare step (environment/prepare.sh) once and fork its members from "
              "that state, instead of each member preparing a fresh sandbox.")
@click.option("--network/--no-network", default=False, help="Network in sandboxes (off).")
@click.option("--verify", "verify", type=click.Choice(["shared", "separate"]), default="shared", show_default=True,
              help="Run the tests in the agent's sandbox, or in a fresh one that gets only the workdir and "
              "declared artifacts (full reward integrity even for a root agent).")
@click.option("--seccomp-allow", "seccomp_allow", multiple=True, metavar="RULE[,RULE...]",
              help="Opt every sandbox out of these rules of the default seccomp filter (docs/security.md), "
              "besides each task's own seccomp_allow; 'unconfined' turns the filter off.")
@click.option("--agent-user", "agent_user", default=None,
              help="Run the agent as this user in every task (root = Docker's behaviour); default: the "
              "task's declared user, else the non-root 'agent'.")
@click.option("--reward-key", default=None,
              help="The named reward of reward.json that trains (default: 'reward', else the only one, else the "
              "mean of all).")
@click.option("--reward-weights", default=None, help="Train on a weighted sum of named rewards instead: a=0.7,b=0.3.")
@click.option(
    "--attempts",
    default=2,
    show_default=True,
    type=int,
    help="Attempts per rollout: an infra_fault (the agent can't have caused it: model server or sandbox lost) "
    "is refilled in place until they run out, then masked (docs/rollouts.md#verdicts).",
)
@click.option("--max-turns", default=30, show_default=True, type=int)
@click.option(
    "--cpu-fraction",
    type=click.FloatRange(0.01, 1.0),
    default=None,
    help="Emulate a slower host: every sandbox runs under one cgroup whose cores deliver this "
    "fraction of this host's (e.g. 0.5).",
)
@click.option(
    "--tool-mode",
    type=click.Choice(["auto", "tools", "text"]),
    default="auto",
    show_default=True,
    help="Commands via tool calls, fenced blocks, or both.",
)
@click.option("--record", "record", type=click.Choice(["none", "commands", "full"]), default="commands",
              show_default=True, help="What records.jsonl keeps of each rollout, for `sandfleet replay`: commands (all "
              "but the model's messages, kept as digests), full (the messages too), none (docs/replay.md).")
@click.option("--branch", "branch", default=None, metavar="TURN:WIDTH[,TURN:WIDTH...]",
              help="Rollouts that branch: after the agent's TURN-th turn the sandbox and the conversation split "
              "into WIDTH children that go on with independent samples (2:4; 1:2,3:2 for two levels). Each leaf is "
              "a rollout row; a group is -n trees (docs/trees.md).")
@click.option("--branch-processes", type=click.Choice(["error", "drop"]), default="error", show_default=True,
              help="At a split, processes the backend can't carry into the children: fail the branch naming "
              "them (those children are masked), or drop them.")
@remote_option("the groups over them (docs/cluster.md), --concurrency then per host")
@ray_option("Spread the groups over a Ray cluster (docs/cluster.md): host:port, auto ($RAY_ADDRESS), or local:N (N "
            "loopback-only nodes here, stopped afterwards); --concurrency is then per node.")
def run(
    tasks_dir: Path,
    agent: str,
    model_url: str | None,
    model: str | None,
    api_key_env: str,
    n: int,
    concurrency_opt: str,
    out_dir: Path,
    backend: str,
    no_limits: bool,
    resume: bool,
    overwrite: bool,
    image: str | None,
    only: tuple[str, ...],
    fork: bool,
    network: bool,
    verify: str,
    seccomp_allow: tuple[str, ...],
    agent_user: str | None,
    reward_key: str | None,
    reward_weights: str | None,
    attempts: int,
    max_turns: int,
    cpu_fraction: float | None,
    tool_mode: str,
    record: str,
    branch: str | None,
    branch_processes: str,
    remote: str | None,
    ray_address: str | None,
) -> None:
    """Run N rollouts of every task with an agent; write rollouts.jsonl, groups.jsonl,
    trace.jsonl and summary.json to OUT and print a summary. An OUT that is not empty is
    refused unless --resume or --overwrite is given."""
    where = Where(remote, ray_address)
    if no_limits:  # for this command's sandboxes and the processes it starts (settings.child_env)
        install(current_settings().replace(no_limits=True))
    explicit = _explicit_concurrency(concurrency_opt)
    leaves = _branch_leaves(branch, agent)
    _check(where, n=n * leaves, concurrency=explicit or n * leaves, out_dir=out_dir, resume=resume,
           overwrite=overwrite,
           cpu_fraction=cpu_fraction)
    tasks = _load(tasks_dir, only, reward_key, reward_weights)
    concurrency = _concurrency(where, explicit, tasks, n * leaves)
    policy = make_policy(agent, model_url=model_url, model=model, api_key_env=api_key_env, max_turns=max_turns,
                         tool_mode=tool_mode)
    if agent == "openai" and model_url and where.ray is None:  # on Ray the nodes reach it, not necessarily here
        check_model_url(model_url)
    config = _config(n=n, concurrency=concurrency, backend=backend, network=network, verify=verify,
                     agent_user=agent_user, seccomp_allow=seccomp_allow, fork=fork, attempts=attempts,
                     record=record, branch=branch or "", branch_processes=branch_processes)
    _check_image(image)
    click.echo(f"run {config.run_id}: {len(tasks)} tasks x {n} with {agent}, concurrency {concurrency} -> {out_dir}",
               err=True)
    mode = "resume" if resume else "overwrite" if overwrite else "new"
    with _progress(len(tasks) * n * leaves) as progress, contextlib.ExitStack() as stack:
        if cpu_fraction is not None:
            from sandfleet.sandbox.cgroups import throttled_parent

            stack.enter_context(throttled_parent(cpu_fraction))
        report = _run(where, tasks, policy, config, out_dir=out_dir, on_result=progress, mode=mode, image=image)
    _print_summary(report, out_dir)
    if report.summary()["n_completed"] == 0:
        raise SystemExit(1)


def _branch_leaves(branch: str | None, agent: str) -> int:
    """The leaves of one tree of ``--branch`` (1 without it); a usage error for a bad spec or an
    agent that takes no turns."""
    if branch is None:
        return 1
    from sandfleet.errors import ConfigError
    from sandfleet.rollout.tree import parse_branch

    try:
        plan = parse_branch(branch)
    except ConfigError as e:
        raise click.BadParameter(str(e).removeprefix("--branch "), param_hint="--branch") from None
    if agent != "openai":
        raise click.UsageError(f"--branch needs an agent that takes turns (--agent openai), not --agent {agent}")
    return plan.leaves


def _explicit_concurrency(value: str) -> int | None:
    """``--concurrency``'s number, or None for ``auto``."""
    if value.strip().lower() == "auto":
        return None
    try:
        n = int(value)
    except ValueError:
        raise click.BadParameter(f"a number or 'auto', not {value!r}", param_hint="--concurrency") from None
    if n < 1:
        raise click.BadParameter(f"must be at least 1, not {n}", param_hint="--concurrency")
    return n


def _concurrency(where: Where, explicit: int | None, tasks: list[Task], n: int) -> int:
    """The run's concurrency: ``auto`` admits what this host's CPUs hold at the tasks' cpus (at
    least a group), an explicit number larger than that is allowed with a warning
    (docs/rollouts.md, "Admission"). Said on stderr. Elsewhere (``--remote``, ``--ray``) the
    number is per host and auto is 8, as before."""
    if where.remote is not None or where.ray is not None:
        if explicit is None:
            click.echo(f"concurrency auto: {max(8, n)} per host (the sandboxes run on other hosts)", err=True)
        return explicit or max(8, n)
    from sandfleet.rollout.admission import choose_concurrency

    value, notes = choose_concurrency(explicit, [t.cpus for t in tasks], group=n)
    for note in notes:
        click.echo(note, err=True)
    return value


def _check(where: Where, *, n: int, concurrency: int, out_dir: Path, resume: bool, overwrite: bool,
           cpu_fraction: float | None) -> None:
    """Usage errors of flags that exclude each other, of a group larger than --concurrency and of OUT."""
    if resume and overwrite:
        raise click.UsageError("--resume and --overwrite exclude each other")
    if where.ray is not None:
        refuse("--ray", {"--remote": where.remote is not None, "--cpu-fraction": cpu_fraction is not None},
               why="runs the sandboxes on the cluster's nodes: it ")
    if 1 <= concurrency < n:
        from sandfleet.rollout.suite import group_too_big

        raise click.UsageError(group_too_big(n, concurrency, flags=True))
    if out_dir.exists() and not out_dir.is_dir():
        raise click.UsageError(f"--out {out_dir} exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (resume or overwrite):
        raise click.UsageError(f"--out {out_dir} is not empty: pass --resume to continue that run, "
                               "--overwrite to replace it, or choose another directory")


def _load(tasks_dir: Path, only: tuple[str, ...], reward_key: str | None, reward_weights: str | None) -> list[Task]:
    """The tasks to run (``--task`` picks some), each scoring the named reward that trains (docs/tasks.md)."""
    from sandfleet.tasks import load_tasks
    from sandfleet.tasks.reward import parse_reward_weights, with_reward_selection

    tasks, failures = load_tasks(tasks_dir)
    for failure in failures:
        click.echo(f"skipped {failure.path.name}: {failure.error}", err=True)
    if only:
        missing = set(only) - {t.name for t in tasks}
        if missing:
            raise click.UsageError(f"no such task: {', '.join(sorted(missing))}")
        tasks = [t for t in tasks if t.name in only]
    if not tasks:
        raise click.UsageError(f"no task to run under {tasks_dir}")
    try:
        weights = parse_reward_weights(reward_weights) if reward_weights else None
        return [with_reward_selection(t, reward_key, weights) for t in tasks]
    except ValueError as e:
        raise click.UsageError(f"--reward-weights: {e}") from None


def _config(*, n: int, concurrency: int, backend: str, network: bool, verify: str, agent_user: str | None,
            seccomp_allow: tuple[str, ...], fork: bool, attempts: int, record: str = "commands", branch: str = "",
            branch_processes: str = "error") -> RunConfig:
    from sandfleet.errors import ConfigError
    from sandfleet.rollout.runner import RetryPolicy
    from sandfleet.rollout.suite import RunConfig

    try:
        return RunConfig(n=n, concurrency=concurrency, backend=backend, network=network, verify=verify,
                         agent_user=agent_user, fork=fork, retry=RetryPolicy(max_attempts=max(1, attempts)),
                         record=record, branch=branch, branch_processes=branch_processes,
                         seccomp_allow=tuple(r for v in seccomp_allow for r in v.split(",") if r.strip()))
    except ConfigError as e:
        raise click.UsageError(str(e)) from None


def _check_image(image: str | None) -> None:
    """``--image``: an image that exists (or ``host``)."""
    if image is None:
        return
    from sandfleet.errors import ConfigError
    from sandfleet.imagestore import resolve_image

    try:
        resolve_image(image)
    except ConfigError as e:
        raise click.UsageError(str(e)) from None


def _run(where: Where, tasks: list[Task], policy: Policy, config: RunConfig, *, out_dir: Path,
         on_result: Callable[[RolloutResult], None], mode: str, image: str | None) -> RunReport:
    """The suite here, on one service, or spread over several services or a Ray cluster."""
    from sandfleet.cluster.suite import run_suite_on_pool
    from sandfleet.errors import ConfigError
    from sandfleet.rollout.suite import run_suite

    kwargs: dict[str, Any] = {}
    if image is not None:

        async def same_image(task: Any) -> str:
            return image

        kwargs["image_for"] = same_image
    try:
        return asyncio.run(dispatch(
            where,
            here=lambda: run_suite(tasks, policy, config, out_dir=out_dir, on_result=on_result, out_mode=mode,
                                   **kwargs),
            on_pool=lambda pool: run_suite_on_pool(tasks, policy, pool, config.n, out_dir=out_dir,
                                                   on_result=on_result, out_mode=mode),
            capacity=config.concurrency, backend=config.backend, network=config.network, fork=config.fork,
            branch=config.branch, branch_processes=config.branch_processes,
            verify=config.verify, agent_user=config.agent_user, retry=config.retry, image=image,
            run_id=config.run_id))
    except ConfigError as e:
        raise click.UsageError(str(e)) from None


def _print_summary(report: RunReport, out_dir: Path) -> None:
    summary = report.summary()
    click.echo(summary_table(summary))
    for node in (summary.get("nodes") or {}).values():  # --ray, --remote URL,URL
        click.echo(f"node {node['label']}: {node['n_rollouts']} rollouts, pass rate {node['pass_rate']:.1%}")
    if report.resumed:
        click.echo(f"resumed: {report.resumed} rollouts of finished groups kept from the earlier run")
    if summary["close_failures"]:
        click.echo(f"warning: {summary['close_failures']} sandboxes failed to close (see the log)", err=True)
    records = ""
    if (out_dir / "records.jsonl").exists():  # the replay records' size (docs/replay.md)
        size, n = (out_dir / "records.jsonl").stat().st_size, summary["n_rollouts"]
        records = f", records.jsonl ({size / 1024:.0f} KiB{f', {size / n / 1024:.1f} KiB per rollout' if n else ''})"
    click.echo(f"wrote {out_dir / 'rollouts.jsonl'}, groups.jsonl, trace.jsonl, summary.json{records}")
