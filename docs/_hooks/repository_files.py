"""An mkdocs hook: the site's pages keep their paths in the repository, so a
link works the same on GitHub and on the site and strict link checking covers
every page.

The pages under `docs/` are served at `docs/...`, `README.md` is the home page,
and `ARCHITECTURE.md` and the recorded runs' reports, notes and plots
(`bench/results/`) become site files without being copied into `docs/`.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files, InclusionLevel

REPOSITORY = Path(__file__).resolve().parents[2]
TOP_LEVEL_PAGES = ("README.md", "ARCHITECTURE.md")
RUN_FILES = ("bench/results/*.md", "bench/results/*/*.md", "bench/results/*/**/*.png")


def _repository_file(path: Path, config: MkDocsConfig) -> File:
    return File(
        path.relative_to(REPOSITORY).as_posix(),
        str(REPOSITORY),
        config.site_dir,
        config.use_directory_urls,
    )


def on_files(files: Files, config: MkDocsConfig) -> Files:
    docs_dir = Path(config.docs_dir).resolve()
    site_files = [
        file
        for file in files
        if file.abs_src_path is None or not Path(file.abs_src_path).is_relative_to(docs_dir)
    ]
    pages = [
        file.abs_src_path
        for file in files
        if file.abs_src_path is not None
        and Path(file.abs_src_path).is_relative_to(docs_dir)
        and file.inclusion is not InclusionLevel.EXCLUDED
    ]
    repository_paths = [Path(page) for page in pages]
    repository_paths += [REPOSITORY / name for name in TOP_LEVEL_PAGES]
    for pattern in RUN_FILES:
        repository_paths += sorted(REPOSITORY.glob(pattern))
    site_files += [_repository_file(path, config) for path in repository_paths]
    return Files(site_files)
