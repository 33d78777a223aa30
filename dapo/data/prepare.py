"""Preparing the training / evaluation data in the DAPO-Math-17k schema: fetch, validate, de-duplicate, record.

``dapo data prepare [--out DIR] [--dedup]`` fetches the two parquet files the presets read
(``recipe.data.train_files`` / ``val_files``)::

    BytedTsinghua-SIA/DAPO-Math-17k  data/dapo-math-17k.parquet  ->  OUT/dapo-math-17k.parquet
    BytedTsinghua-SIA/AIME-2024      data/aime-2024.parquet      ->  OUT/aime-2024.parquet

then builds the evaluation benchmarks AIME-2025 (``aime-2025.parquet``, 30 x 32) and MATH-500 (``math-500.parquet``,
500 x 4) from their hub datasets in the same schema and prompt template (:mod:`dapo.data.benchmarks`; ``--benchmarks``),
validates every row, reports unique vs total prompts (the hub training file is ~17.9k problems, each repeated ~100
times: 1,791,700 rows), optionally writes a de-duplicated training file (``dapo-math-17k-dedup.parquet``) and prints
what one epoch over each file means in rollout and gradient steps for the presets (see ``dapo.plan.steps``).

The rows are in the DAPO schema (:mod:`dapo.data.schema`); files are checked, de-duplicated and written by
:mod:`dapo.data.files`; ``dapo data`` is :mod:`dapo.data.cli`.

Idempotent and crash-safe: each output is written to a temporary file in the output directory, validated, then
renamed into place (``os.replace``), so a reader never sees a half-written parquet; ``manifest.json`` beside the files
records their sha256, and files whose checksum matches are not fetched again.

Sources: the Hugging Face hub by default (``huggingface_hub``; ``HF_TOKEN`` or the file ``HF_TOKEN_PATH``, ``HF_ENDPOINT``),
or a local copy: ``--source DIR`` (a mirror laid out as ``DIR/<owner>/<name>/<path>`` or holding the files directly)
or ``--train-repo file:///path/to/repo-root`` / a path to the parquet file itself.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from dapo.util.fsutil import atomic_write_text, temp_beside
from dapo.data.parquet import DataError
from dapo.data.schema import FileReport
from dapo.data.files import check_file, dedup_file, sha256_file

# --------------------------------------------------------------------------------------------------------------------
# Where the data lives
# --------------------------------------------------------------------------------------------------------------------

TRAIN_REPO = "BytedTsinghua-SIA/DAPO-Math-17k"
TRAIN_PATH_IN_REPO = "data/dapo-math-17k.parquet"
VAL_REPO = "BytedTsinghua-SIA/AIME-2024"
VAL_PATH_IN_REPO = "data/aime-2024.parquet"

# file names the presets use (dapo/presets/_dapo_qwen32b.yaml: /shared/data/<name>)
TRAIN_FILE = "dapo-math-17k.parquet"
VAL_FILE = "aime-2024.parquet"
DEDUP_FILE = "dapo-math-17k-dedup.parquet"
MANIFEST = "manifest.json"

# evaluation benchmarks `prepare` builds beside the two release files (dapo.data.benchmarks)
EXTRA_BENCHMARKS = ("aime25", "math500")


# --------------------------------------------------------------------------------------------------------------------
# Fetching: the hub, or a local copy
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class Source:
    """Where one file comes from; ``fetch(dest)`` copies it to ``dest``."""

    description: str
    fetch: Callable[[Path], None]


def _local_candidates(root: Path, repo: str, path_in_repo: str) -> list[Path]:
    name = Path(path_in_repo).name
    return [root / repo / path_in_repo, root / path_in_repo, root / name]


def resolve_source(spec: str, path_in_repo: str, *, source_dir: Optional[str] = None,
                   revision: Optional[str] = None) -> Source:
    """``spec``: a hub dataset id (``owner/name``), ``file:///dir`` (a repo root or the file), or a local path.

    With ``source_dir`` a hub id is looked up in the local mirror instead of the hub.
    """

    def local(path: Path) -> Source:
        def fetch(dest: Path) -> None:
            shutil.copyfile(path, dest)

        return Source(str(path), fetch)

    def from_root(root: Path, repo: str) -> Source:
        if root.is_file():
            return local(root)
        candidates = _local_candidates(root, repo, path_in_repo) if repo else [root / path_in_repo,
                                                                            root / Path(path_in_repo).name]
        for c in candidates:
            if c.is_file():
                return local(c)
        raise DataError(f"{path_in_repo} not found under {root} (looked for: {', '.join(map(str, candidates))})")

    if spec.startswith("file://"):
        return from_root(Path(spec[len("file://"):]), "")
    if Path(spec).exists():
        return from_root(Path(spec), "")
    if source_dir:
        return from_root(Path(source_dir), spec)
    if spec.count("/") != 1:
        raise DataError(f"{spec!r} is neither a hub dataset id (owner/name) nor an existing local path")
    return _hub_source(spec, path_in_repo, revision)


def _hub_source(repo: str, path_in_repo: str, revision: Optional[str]) -> Source:
    url = f"hf://datasets/{repo}/{path_in_repo}" + (f"@{revision}" if revision else "")

    def fetch(dest: Path) -> None:
        try:
            from huggingface_hub import hf_hub_download
        except ImportError as exc:  # pragma: no cover - a core dependency
            raise DataError("huggingface_hub is not installed: pip install huggingface_hub") from exc
        staging = dest.parent / f".{dest.name}.hub"
        try:
            got = hf_hub_download(
                repo_id=repo,
                filename=path_in_repo,
                repo_type="dataset",
                revision=revision,
                token=os.environ.get("HF_TOKEN") or None,
                local_dir=str(staging),
            )
            shutil.move(got, dest)
        except DataError:
            raise
        except Exception as exc:  # network, auth, missing file: say what to do about it
            raise DataError(
                f"could not download {url}: {type(exc).__name__}: {exc}\n"
                "  (set HF_TOKEN for gated/private repos, HF_ENDPOINT for a mirror, or pass --source DIR / "
                "--train-repo file:///path with a local copy)"
            ) from exc
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    return Source(url, fetch)


# --------------------------------------------------------------------------------------------------------------------
# prepare
# --------------------------------------------------------------------------------------------------------------------


def _load_manifest(out: Path) -> dict[str, Any]:
    p = out / MANIFEST
    if not p.exists():
        return {"format": 1, "files": {}}
    try:
        data = json.loads(p.read_text())
        if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
            raise ValueError("no 'files' mapping")
        return data
    except (ValueError, OSError) as exc:
        print(f"warning: {p} is unreadable ({exc}); checksums will be recomputed", file=sys.stderr)
        return {"format": 1, "files": {}}


def _save_manifest(out: Path, manifest: dict[str, Any]) -> None:
    atomic_write_text(out / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def _entry(report: FileReport, source: str, **extra: Any) -> dict[str, Any]:
    return {
        "sha256": report.sha256,
        "bytes": Path(report.path).stat().st_size,
        "rows": report.rows,
        "unique_prompts": report.unique_prompts,
        "min_repeats": report.min_repeats,
        "max_repeats": report.max_repeats,
        "source": source,
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **extra,
    }


def _report_from_entry(path: Path, entry: dict[str, Any]) -> FileReport:
    return FileReport(path=str(path), rows=entry["rows"], unique_prompts=entry.get("unique_prompts"),
                      min_repeats=entry.get("min_repeats"), max_repeats=entry.get("max_repeats"),
                      sha256=entry["sha256"])


def _up_to_date(path: Path, entry: Optional[dict[str, Any]], log: Callable[[str], None]) -> bool:
    if not path.exists() or not entry:
        return False
    digest = sha256_file(path)
    if digest == entry.get("sha256"):
        return True
    log(f"{path.name}: checksum {digest[:12]} differs from the manifest ({str(entry.get('sha256'))[:12]}); "
        "fetching again")
    return False


def _fetch_one(out: Path, name: str, source: Source, manifest: dict[str, Any], *, aime: bool, force: bool,
               log: Callable[[str], None]) -> FileReport:
    target = out / name
    entry = manifest["files"].get(name)
    if not force and _up_to_date(target, entry, log):
        log(f"{name}: present, checksum matches the manifest -- skipped")
        return _report_from_entry(target, entry)
    tmp = temp_beside(target, ".download")
    log(f"{name}: fetching {source.description}")
    try:
        source.fetch(tmp)
        report = check_file(tmp, aime=aime)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if not report.ok:
        kept = out / f".{name}.rejected"
        os.replace(tmp, kept)
        raise DataError(
            f"{source.description} failed validation; nothing in {out} was replaced "
            f"(the download is kept at {kept} for inspection):\n  " + "\n  ".join(str(p) for p in report.problems)
        )
    os.replace(tmp, target)
    report.path = str(target)
    manifest["files"][name] = _entry(report, source.description)
    _save_manifest(out, manifest)
    return report


def _write_dedup(out: Path, train: FileReport, manifest: dict[str, Any], *, force: bool,
                 log: Callable[[str], None]) -> FileReport:
    target = out / DEDUP_FILE
    entry = manifest["files"].get(DEDUP_FILE)
    if (not force and entry and entry.get("derived_from_sha256") == train.sha256
            and _up_to_date(target, entry, log)):
        log(f"{DEDUP_FILE}: present and derived from the current {TRAIN_FILE} -- skipped")
        return _report_from_entry(target, entry)
    dedup_file(out / TRAIN_FILE, target)
    report = check_file(target)
    if not report.ok or report.max_repeats != 1:  # pragma: no cover - our own output; guards a regression
        target.unlink(missing_ok=True)
        raise DataError(f"{target}: de-duplicated file failed its own check: {report.summary()}")
    manifest["files"][DEDUP_FILE] = _entry(report, f"dedup of {TRAIN_FILE}", derived_from_sha256=train.sha256)
    _save_manifest(out, manifest)
    log(f"{DEDUP_FILE}: wrote {report.rows:,} rows (one per unique prompt)")
    return report


def _benchmark_sources(bench, spec: str, source_dir: Optional[str],
                       revision: Optional[str]) -> list[tuple[Source, str]]:
    """The raw problem file(s) of ``bench`` as (source, file name): a local file, a local copy of a dataset
    repository, or a known hub dataset's files (from the ``--source`` mirror or the hub)."""
    from dapo.data.benchmarks import KNOWN_SOURCES

    if spec.startswith("file://"):
        spec = spec[len("file://"):]
    if Path(spec).is_file():
        return [(resolve_source(spec, Path(spec).name), Path(spec).name)]
    known = KNOWN_SOURCES.get(bench.name, {})
    if Path(spec).is_dir():
        paths = bench.paths if (Path(spec) / bench.paths[0]).exists() else next(
            (ps for ps in known.values() if (Path(spec) / ps[0]).exists()), bench.paths)
        return [(resolve_source(spec, p), Path(p).name) for p in paths]
    if spec not in known:
        raise DataError(f"--{bench.name}-repo {spec!r}: not a local file and not a known {bench.title} dataset "
                        f"({', '.join(known)}); pass a jsonl/json/parquet file with problem and answer columns")
    return [(resolve_source(spec, p, source_dir=source_dir, revision=revision), Path(p).name) for p in known[spec]]


def _fetch_benchmark(out: Path, bench, spec: str, manifest: dict[str, Any], *, source_dir: Optional[str],
                     revision: Optional[str], force: bool, log: Callable[[str], None]) -> FileReport:
    """Raw problems -> ``out/<bench.file>`` in the DAPO schema and prompt template, checked as N problems x k."""
    from dapo.data.benchmarks import BenchmarkError, write_benchmark

    target = out / bench.file
    entry = manifest["files"].get(bench.file)
    sources = _benchmark_sources(bench, spec, source_dir, revision)
    described = " + ".join(s.description for s, _ in sources)
    if not force and entry and entry.get("source") != described:
        log(f"{bench.file}: built from {entry.get('source')}, now asked for {described}; building again")
    elif not force and _up_to_date(target, entry, log):
        log(f"{bench.file}: present, checksum matches the manifest -- skipped")
        return _report_from_entry(target, entry)
    log(f"{bench.file}: building {bench.title} from {described}")
    raws = [temp_beside(out / f"{bench.name}-raw", f"-{name}") for _, name in sources]
    tmp = temp_beside(target, ".build")
    try:
        for (src, _), raw in zip(sources, raws):
            src.fetch(raw)
        raw_sha = [sha256_file(r) for r in raws]
        try:
            write_benchmark(bench, raws, tmp, described)
        except BenchmarkError as exc:
            raise DataError(f"{bench.title}: {exc}; nothing in {out} was replaced") from None
        report = check_file(tmp, layout=(bench.problems, bench.copies), title=bench.title)
        if not report.ok:  # pragma: no cover - our own output; guards a regression
            raise DataError(f"{bench.title}: the built file failed its check:\n  " +
                            "\n  ".join(str(p) for p in report.problems))
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
        for r in raws:
            r.unlink(missing_ok=True)
    report.path = str(target)
    manifest["files"][bench.file] = _entry(report, described, raw_sha256=raw_sha, benchmark=bench.name,
                                           layout=f"{bench.problems}x{bench.copies}")
    _save_manifest(out, manifest)
    return report


@dataclass
class PrepareResult:
    out: Path
    train: FileReport
    val: FileReport
    dedup: Optional[FileReport] = None
    benchmarks: dict[str, FileReport] = field(default_factory=dict)


def prepare(out: str | os.PathLike, *, dedup: bool = False, train_repo: str = TRAIN_REPO,
            val_repo: str = VAL_REPO, source_dir: Optional[str] = None, revision: Optional[str] = None,
            force: bool = False, log: Callable[[str], None] = print,
            benchmarks: Iterable[str] = EXTRA_BENCHMARKS,
            benchmark_repos: Optional[dict[str, str]] = None) -> PrepareResult:
    """Fetch + validate the training and AIME files into ``out``, then build the extra evaluation ``benchmarks``
    (AIME-2025, MATH-500; :mod:`dapo.data.benchmarks`) from ``benchmark_repos`` (name -> hub id or file; default the
    benchmark's hub dataset). Idempotent; see the module docstring."""
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = _load_manifest(out_dir)
    train_src = resolve_source(train_repo, TRAIN_PATH_IN_REPO, source_dir=source_dir, revision=revision)
    val_src = resolve_source(val_repo, VAL_PATH_IN_REPO, source_dir=source_dir, revision=revision)
    train = _fetch_one(out_dir, TRAIN_FILE, train_src, manifest, aime=False, force=force, log=log)
    val = _fetch_one(out_dir, VAL_FILE, val_src, manifest, aime=True, force=force, log=log)
    result = PrepareResult(out_dir, train, val)
    if dedup:
        result.dedup = _write_dedup(out_dir, train, manifest, force=force, log=log)
    from dapo.data.benchmarks import get as get_benchmark

    for name in benchmarks:
        bench = get_benchmark(name)
        if bench.repo is None:
            continue  # aime24: the release's ready-made file, fetched above
        spec = (benchmark_repos or {}).get(name) or bench.repo
        result.benchmarks[name] = _fetch_benchmark(out_dir, bench, spec, manifest, source_dir=source_dir,
                                                   revision=revision if spec == bench.repo else None, force=force,
                                                   log=log)
    return result

