"""`loom versions`: a job's published weight versions from the command line. List them with
lineage, aliases and metrics; compare two manifests; move an alias; delete a version; set the
job's retention; download one as a Hugging Face directory. A thin face over the SDK, so every
refusal is the store's own message (a pinned version, an unknown alias)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from pydantic import BaseModel, TypeAdapter
from rich.markup import escape
from rich.table import Table

from agents.sdk import JobClient, LoomClient
from cli.common import (
    ApiKeyOption,
    DataDirOption,
    UrlOption,
    api_key_for,
    console,
    fail,
    require_gateway,
    settings_for,
)
from gateway.formatting import human_size
from modelstate.schemas import ManifestDiff, Version
from services.common.errors import LoomError

versions_app = typer.Typer(
    help="A job's published weight versions (the model-state store).", no_args_is_help=True
)

JobArg = Annotated[str, typer.Argument(help="The job's id.")]
RefArg = Annotated[str, typer.Argument(help="A version number or an alias (`latest`, `best`).")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
VERSION_LIST = TypeAdapter(list[Version])


@contextmanager
def _job(
    job_id: str, url: str | None, api_key: str | None, data_dir: Path | None
) -> Iterator[JobClient]:
    """The job on a running stack; a refusal from any call made with it ends the command
    with its message and exit status 1."""
    settings = settings_for(data_dir)
    url = url or settings.gateway_url
    require_gateway(url)
    with LoomClient(url, api_key_for(api_key, settings)) as loom:
        try:
            yield loom.get_job(job_id)
        except LoomError as exc:
            fail(exc.message)


def _print_json(model: BaseModel | list[Version]) -> None:
    """Plain JSON, never wrapped or coloured, for scripts to read."""
    if isinstance(model, list):
        typer.echo(VERSION_LIST.dump_json(model, indent=2).decode())
    else:
        typer.echo(model.model_dump_json(indent=2))


def _versions_table(title: str, versions: list[Version]) -> Table:
    table = Table(title=title)
    for column in (
        "version",
        "kind",
        "step",
        "parent",
        "aliases",
        "files",
        "size",
        "metrics",
        "created (UTC)",
    ):
        table.add_column(column)
    for v in versions:
        table.add_row(
            str(v.number),
            v.kind.value,
            _or_dash(v.step),
            _or_dash(v.parent),
            ", ".join(sorted(v.aliases)),
            str(len(v.files)),
            human_size(sum(f.size for f in v.files)),
            escape(", ".join(f"{name}={value:g}" for name, value in sorted(v.metrics.items()))),
            v.created_at.strftime("%Y-%m-%d %H:%M:%S"),
        )
    return table


def _or_dash(value: int | None) -> str:
    return "–" if value is None else str(value)


@versions_app.command("list")
def list_versions(
    job_id: JobArg,
    as_json: JsonOption = False,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Every version of the job, oldest first."""
    with _job(job_id, url, api_key, data_dir) as job:
        versions = job.versions()
    if as_json:
        _print_json(versions)
    elif versions:
        console.print(_versions_table(f"Versions of {job_id}", versions))
    else:
        console.print(f"Job {job_id} has published no version yet.")


@versions_app.command()
def show(
    job_id: JobArg,
    ref: RefArg = "latest",
    as_json: JsonOption = False,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """One version's lineage (it and its ancestors, newest first) and its files."""
    with _job(job_id, url, api_key, data_dir) as job:
        lineage = job.lineage(ref)
    if as_json:
        _print_json(lineage)
        return
    version = lineage.versions[0]
    console.print(
        _versions_table(f"Version {version.number} of {job_id} and its ancestors", lineage.versions)
    )
    if not lineage.complete:
        console.print("An ancestor was deleted: the lineage stops before the base model.")
    console.print(f"Base model: {version.base_model}", markup=False)
    files = Table(title="Files")
    for column in ("path", "bytes", "sha256"):
        files.add_column(column)
    for file in version.files:
        files.add_row(escape(file.path), str(file.size), file.sha256)
    console.print(files)


@versions_app.command()
def compare(
    job_id: JobArg,
    a: RefArg,
    b: RefArg = "latest",
    as_json: JsonOption = False,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Which files differ between versions A and B, and how much of B is stored once for both."""
    with _job(job_id, url, api_key, data_dir) as job:
        diff = job.compare(a, b)
    if as_json:
        _print_json(diff)
    else:
        _print_diff(diff)


def _print_diff(diff: ManifestDiff) -> None:
    table = Table(title=f"{diff.job_id}: version {diff.a} → {diff.b}")
    for column in ("change", "path", f"bytes in {diff.a}", f"bytes in {diff.b}"):
        table.add_column(column)
    for file in diff.added:
        table.add_row("added", escape(file.path), "–", str(file.size))
    for file in diff.removed:
        table.add_row("removed", escape(file.path), str(file.size), "–")
    for change in diff.changed:
        table.add_row("changed", escape(change.path), str(change.a.size), str(change.b.size))
    if diff.added or diff.removed or diff.changed:
        console.print(table)
    else:
        console.print(f"Versions {diff.a} and {diff.b} hold the same files.")
    console.print(
        f"{len(diff.unchanged)} file(s) unchanged; {human_size(diff.shared_bytes)} of "
        f"version {diff.b} stored once for both."
    )


@versions_app.command()
def alias(
    job_id: JobArg,
    name: Annotated[str, typer.Argument(help="The alias, e.g. `best`.")],
    number: Annotated[int, typer.Argument(help="The version it should name.")],
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Point an alias at a version (created, or moved atomically)."""
    with _job(job_id, url, api_key, data_dir) as job:
        moved = job.move_alias(name, number)
    console.print(f"{moved.name} → version {moved.number} of {moved.job_id}")


@versions_app.command()
def delete(
    job_id: JobArg,
    number: Annotated[int, typer.Argument(help="The version number.")],
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Delete a version: refused while an alias names it or a rollout engine serves it.

    Its files go at the next garbage collection unless another version shares them."""
    with _job(job_id, url, api_key, data_dir) as job:
        deleted = job.delete_version(number)
    console.print(f"Deleted version {deleted.number} of {deleted.job_id}.")


@versions_app.command()
def retention(
    job_id: JobArg,
    keep_last: Annotated[
        int | None,
        typer.Option("--keep-last", min=0, help="Keep the newest N versions (0: keep all)."),
    ] = None,
    keep_ancestors: Annotated[
        bool,
        typer.Option("--keep-ancestors", help="Also keep every ancestor of an aliased version."),
    ] = False,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Show, or with --keep-last set, which versions garbage collection keeps."""
    with _job(job_id, url, api_key, data_dir) as job:
        policy = (
            job.retention()
            if keep_last is None
            else job.set_retention(keep_last, keep_ancestors=keep_ancestors)
        )
    n = policy.keep_last
    kept = "every version" if n == 0 else f"the newest {n} version{'s' if n > 1 else ''}"
    if policy.keep_ancestors:
        kept += " and the ancestors of aliased versions"
    default = " (the store's default)" if policy.is_default else ""
    console.print(f"{job_id} keeps {kept}{default}; aliased and served versions always stay.")


@versions_app.command()
def download(
    job_id: JobArg,
    dest: Annotated[Path, typer.Argument(help="Directory to write (created).")],
    ref: Annotated[str, typer.Option("--ref", help="Version number or alias.")] = "latest",
    merge_lora: Annotated[
        bool,
        typer.Option(
            "--merge-lora",
            help="A LoRA version merged into its base model: a full Hugging Face model directory.",
        ),
    ] = False,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Write a version as a Hugging Face directory (config, tokenizer, weights)."""
    with _job(job_id, url, api_key, data_dir) as job:
        path = job.download(dest, ref, merge_lora=merge_lora)
    files = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())
    console.print(f"Wrote {len(files)} file(s) to {path}: {', '.join(files)}", markup=False)
