"""The Chinese edition: each notebook's twin in notebooks/zh/, built from the English notebook
and a translation file, so that the two cannot drift apart.

    python scripts/build_twins.py             # write every twin that has a translation file
    python scripts/build_twins.py notebooks/01_the_math.ipynb   # only these twins
    python scripts/build_twins.py --check     # write nothing; report stale or missing cells
    python scripts/build_twins.py --skeleton notebooks/01_the_math.ipynb
                                              # add the cells a translation file lacks

A translation file (``notebooks/zh/translations/<notebook>.md``, solutions under
``solutions/``) has one section per markdown cell of the English notebook, headed by the cell's
id and a hash of its English source::

    <!-- cell 448c2880 source 1a2b3c4d5e6f -->
    译文 ...

A section ``<!-- output ID source HASH -->`` says in Chinese what code cell ID prints (the hash
is that of the English cell's stdout; its numbers must be the English ones): the twin shows it
in place of the English text, so a headline figure reads in the reader's language.

A twin is the English notebook with each markdown cell replaced by its translation. Its code
cells, their outputs and the widget state are the English ones (links in Markdown and HTML
outputs rewritten for the twin's folder; an exercise checker's output framed in Chinese, as a
kernel of the Chinese edition prints it; the stored sliders' labels and summaries said in
Chinese, as a kernel of the Chinese edition draws them), so the twin needs no
execution of its own (CI runs the English notebook). Links are rewritten for the twin's
folder: a link to a notebook points at that notebook's twin, its anchor at the translated
heading (Jupyter's anchors are the heading's text), and any other relative link at the same
file as before. The first cell ends with a link to the English notebook.

A changed English cell makes its translation stale (its hash no longer matches); ``--check``
and tests/test_twins.py name each stale or missing cell.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
TWINS = NOTEBOOKS / "zh"
TRANSLATIONS = TWINS / "translations"
MARKER = re.compile(r"^<!-- (cell|output) (\S+) source ([0-9a-f]{12}) -->[ \t]*$", re.M)
#: a translation file's key for what a code cell prints (a section "<!-- output ID source HASH -->"
#: whose hash is that of the English cell's printed text)
OUTPUT = "output:"
TODO = "TODO-翻译"
LINK = re.compile(r"(\]\()([^)\s]+)(\))")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$", re.M)


#: the run-time sentence that scripts/execute_notebooks.py rewrites in a notebook's first cell,
#: and the Chinese one a translation states it in ("约 N s"): a new run time is copied into the
#: twin, it does not make the translation stale
RUN_TIME = re.compile(r"(Run time on \d+ CPU cores? \(`ci` profile\): about )(\d+)( s\.)")
RUN_TIME_ZH = re.compile(r"(约\s*(?:需\s*)?)(\d+)(\s*s)")


def source_hash(source: str) -> str:
    """Return the hash a translation records of its English cell's source (its run time,
    which every execution rewrites, left out)."""
    normalised = RUN_TIME.sub(r"\1N\3", source)
    return hashlib.sha256(normalised.encode("utf-8")).hexdigest()[:12]


def with_run_time(translation: str, english: str, where: str) -> str:
    """Return the translated first cell with the English cell's current run time."""
    english_time = RUN_TIME.search(english)
    if english_time is None:
        return translation
    if len(RUN_TIME_ZH.findall(translation)) != 1:
        raise ValueError(f"{where}: the translation must state the run time once, as "
                         "'约 N s' (the English says it once)")
    return RUN_TIME_ZH.sub(lambda m: f"{m.group(1)}{english_time.group(2)}{m.group(3)}",
                           translation)


def english_notebooks() -> list[Path]:
    """Return the series' notebooks and solutions, in order."""
    return sorted(NOTEBOOKS.glob("*.ipynb")) + sorted((NOTEBOOKS / "solutions").glob("*.ipynb"))


def relative(path: Path) -> PurePosixPath:
    """Return ``path`` relative to notebooks/ (``01_x.ipynb``, ``solutions/01_x_solutions...``)."""
    return PurePosixPath(path.resolve().relative_to(NOTEBOOKS.resolve()).as_posix())


def translation_path(notebook: Path) -> Path:
    """Return the translation file of an English notebook."""
    return TRANSLATIONS / relative(notebook).with_suffix(".md")


#: a twin's name is its English notebook's with this suffix (00_the_article.zh.ipynb), so that
#: the two open as tabs a reader can tell apart
TWIN_SUFFIX = ".zh.ipynb"


def twin_name(notebook: PurePosixPath) -> PurePosixPath:
    """Return the twin's path for an English notebook's path (both relative to their folder)."""
    return notebook.with_name(notebook.name.removesuffix(".ipynb") + TWIN_SUFFIX)


def twin_path(notebook: Path) -> Path:
    """Return where an English notebook's twin is written."""
    return TWINS / twin_name(relative(notebook))


@dataclass(frozen=True)
class Entry:
    """One translated cell: the hash of the English source it translates, and the text."""

    source_hash: str
    text: str


def read_translation(path: Path) -> dict[str, Entry]:
    """Return {cell id: Entry} from a translation file (empty if there is none)."""
    if not path.exists():
        return {}
    text = path.read_text(encoding="utf-8")
    markers = list(MARKER.finditer(text))
    entries: dict[str, Entry] = {}
    for index, marker in enumerate(markers):
        end = markers[index + 1].start() if index + 1 < len(markers) else len(text)
        cell_id = marker.group(2) if marker.group(1) == "cell" else OUTPUT + marker.group(2)
        if cell_id in entries:
            raise ValueError(f"{path}: cell {cell_id} is translated twice")
        entries[cell_id] = Entry(marker.group(3), text[marker.end():end].strip("\n"))
    return entries


def markdown_cells(notebook: dict) -> list[dict]:
    """Return the notebook's markdown cells."""
    return [cell for cell in notebook["cells"] if cell["cell_type"] == "markdown"]


def _source(cell: dict) -> str:
    return "".join(cell["source"])


def printed(cell: dict) -> str:
    """Return what a code cell printed (its stdout), as one text."""
    return "".join("".join(output["text"]) for output in cell.get("outputs", [])
                   if output.get("name") == "stdout")


def localize_output(cell: dict, entries: dict[str, Entry]) -> None:
    """Put the translation of what a code cell printed, where the translation file has one, in
    place of its stdout (the English text's numbers, said in Chinese)."""
    entry = entries.get(OUTPUT + cell["id"])
    if entry is None:
        return
    streams = [output for output in cell["outputs"] if output.get("name") == "stdout"]
    streams[0]["text"] = entry.text + "\n"
    cell["outputs"] = [output for output in cell["outputs"]
                       if output.get("name") != "stdout" or output is streams[0]]


def problems(notebook_path: Path) -> list[str]:
    """Return a line per markdown cell whose translation is missing, stale or a TODO, and per
    translated cell that is no longer in the notebook."""
    notebook = json.loads(notebook_path.read_text(encoding="utf-8"))
    entries = read_translation(translation_path(notebook_path))
    name = relative(notebook_path)
    found = []
    ids = set()
    for cell in markdown_cells(notebook):
        ids.add(cell["id"])
        entry = entries.get(cell["id"])
        if entry is None:
            found.append(f"{name}: cell {cell['id']} has no translation")
        elif entry.source_hash != source_hash(_source(cell)):
            found.append(f"{name}: cell {cell['id']} changed since it was translated "
                         f"(translated {entry.source_hash}, now {source_hash(_source(cell))})")
        elif TODO in entry.text or not entry.text.strip():
            found.append(f"{name}: cell {cell['id']} is not translated yet")
    for cell in notebook["cells"]:
        entry = entries.get(OUTPUT + cell["id"])
        if entry is None or cell["cell_type"] != "code":
            continue
        ids.add(OUTPUT + cell["id"])
        if entry.source_hash != source_hash(printed(cell)):
            found.append(f"{name}: what cell {cell['id']} prints changed since it was translated "
                         f"(translated {entry.source_hash}, now {source_hash(printed(cell))})")
    found += [f"{name}: the translation of cell {cell_id} has no cell in the notebook"
              for cell_id in entries if cell_id not in ids]
    return found


def anchor(heading: str) -> str:
    """Return JupyterLab's anchor of a heading: its rendered text (no code ticks, no bold
    marks), spaces replaced by '-'."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip())
    return re.sub(r"\s", "-", re.sub(r"\*\*|__", "", text))


def _headings(text: str) -> list[str]:
    return [match.group(2) for match in HEADING.finditer(re.sub(r"```.*?```", "", text,
                                                                flags=re.S))]


def anchor_map(notebook_path: Path) -> dict[str, str]:
    """Return {English anchor: translated anchor} for one notebook's headings, cell by cell."""
    notebook = json.loads(notebook_path.read_text(encoding="utf-8"))
    entries = read_translation(translation_path(notebook_path))
    mapping = {}
    for cell in markdown_cells(notebook):
        entry = entries.get(cell["id"])
        english = _headings(_source(cell))
        translated = _headings(entry.text) if entry else english
        if len(english) != len(translated):
            raise ValueError(f"{relative(notebook_path)}: cell {cell['id']} has {len(english)} "
                             f"heading(s) in English and {len(translated)} in its translation")
        mapping.update({anchor(e): anchor(t) for e, t in zip(english, translated, strict=True)})
    return mapping


class Linker:
    """Rewrites a translated cell's links for its twin's folder."""

    def __init__(self) -> None:
        self._anchors: dict[PurePosixPath, dict[str, str]] = {}

    def anchors(self, notebook: PurePosixPath) -> dict[str, str]:
        """Return the anchor map of the notebook at ``notebook`` (relative to notebooks/)."""
        if notebook not in self._anchors:
            path = NOTEBOOKS / notebook
            self._anchors[notebook] = anchor_map(path) if path.exists() else {}
        return self._anchors[notebook]

    def rewrite(self, text: str, notebook: PurePosixPath) -> str:
        """Return ``text`` with its links rewritten for the twin of ``notebook``."""
        folder = PurePosixPath("notebooks") / notebook.parent

        def one(match: re.Match) -> str:
            target = match.group(2)
            if re.match(r"^[a-z]+:", target):  # https:, mailto:
                return match.group(0)
            path, _, fragment = target.partition("#")
            if not path:  # a heading of this notebook
                return f"{match.group(1)}#{self.anchors(notebook).get(fragment, fragment)})"
            resolved = PurePosixPath(os.path.normpath(str(folder / path)))
            twin_folder = PurePosixPath("notebooks/zh") / notebook.parent
            inside = PurePosixPath(*resolved.parts[1:])
            if (resolved.suffix == ".ipynb" and resolved.parts[0] == "notebooks"
                    and translation_path(NOTEBOOKS / inside).exists()):  # it has a twin
                resolved = PurePosixPath("notebooks/zh") / twin_name(inside)
                if fragment:
                    fragment = self.anchors(inside).get(fragment, fragment)
            new = os.path.relpath(str(resolved), str(twin_folder))
            return f"{match.group(1)}{new}{'#' + fragment if fragment else ''}{match.group(3)}"

        return LINK.sub(one, text)


LINKED_OUTPUTS = ("text/markdown", "text/html")  # outputs whose links a browser follows


def rewrite_output_links(cell: dict, notebook: PurePosixPath, linker: Linker) -> None:
    """Rewrite, in place, the links of a code cell's Markdown and HTML outputs for the twin's
    folder (a relative link printed by the English notebook would point nowhere from
    notebooks/zh/); the outputs are otherwise the English ones."""
    for output in cell.get("outputs", []):
        for key in LINKED_OUTPUTS:
            if key in output.get("data", {}):
                text = output["data"][key]
                joined = "".join(text) if isinstance(text, list) else text
                output["data"][key] = linker.rewrite(joined, notebook)


CHECKER_CELL = re.compile(r"^check_exercise\(\"([\w.]+)\"")
NO_ANSWER = re.compile(r"^Exercise [\w.]+ \(.*\): no answer yet\..*$")
CORRECT = re.compile(r"^✓ Exercise [\w.]+: correct\. (.*)$")


def localize_feedback(cell: dict) -> None:
    """Give, in place, an exercise checker cell the output a kernel of the Chinese edition
    prints (gradaccum_course.language() is "zh" there): all in Chinese, what
    the checker computed included, with its numbers."""
    from gradaccum_course import exercises

    found = CHECKER_CELL.match("".join(cell["source"]).strip())
    if not found:
        return
    exercise_id = found.group(1)
    for output in cell.get("outputs", []):
        if output.get("output_type") != "stream":
            continue
        text = "".join(output["text"]) if isinstance(output["text"], list) else output["text"]
        lines = []
        for line in text.split("\n"):
            correct = CORRECT.match(line)
            if NO_ANSWER.match(line):
                line = exercises.no_answer_message(exercise_id, "zh")
            elif correct:
                line = exercises.correct_message(exercise_id, correct.group(1), "zh")
            lines.append(line)
        output["text"] = "\n".join(lines)


WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def localize_widgets(notebook: dict) -> None:
    """Say, in place, the stored widgets' texts as a kernel of the Chinese edition draws them
    (gradaccum_course.language() is "zh" there): each control's description and each Label's
    text that an explorer of gradaccum_course.widgets shows (a placeholder, a dropdown's
    choices, each text between an HTML widget's tags included), through
    gradaccum_course.widgets.localize_text (the same numbers); any other text stays."""
    from gradaccum_course.widgets import localize_text

    state = notebook.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for model in state.values():
        values = model.get("state", {})
        keys = ["description", "placeholder"] + (
            ["value"] if model.get("model_name") == "LabelModel" else [])
        for key in keys:
            if isinstance(values.get(key), str) and values[key]:
                values[key] = localize_text(values[key], "zh")
        if isinstance(values.get("_options_labels"), list):  # a dropdown's choices
            values["_options_labels"] = [localize_text(label, "zh")
                                         for label in values["_options_labels"]]
        if model.get("model_name") == "HTMLModel" and isinstance(values.get("value"), str):
            values["value"] = re.sub(r">([^<]+)<", lambda text: ">" + localize_text(
                text.group(1), "zh") + "<", values["value"])  # each text between tags


def english_link(notebook: PurePosixPath) -> str:
    """Return the line a twin's first cell ends with: a link to the English notebook."""
    back = os.path.relpath(str(PurePosixPath("notebooks") / notebook),
                           str(PurePosixPath("notebooks/zh") / notebook.parent))
    return f"\n\n[English version / 英文版]({back})"


def build_twin(notebook_path: Path, linker: Linker | None = None) -> dict:
    """Return the twin of an English notebook (its translation must be current)."""
    found = problems(notebook_path)
    if found:
        raise ValueError("cannot build the twin:\n" + "\n".join(found))
    linker = linker or Linker()
    name = relative(notebook_path)
    notebook = json.loads(notebook_path.read_text(encoding="utf-8"))
    entries = read_translation(translation_path(notebook_path))
    twin = copy.deepcopy(notebook)
    for index, cell in enumerate(twin["cells"]):
        if cell["cell_type"] == "code":
            rewrite_output_links(cell, name, linker)
            localize_feedback(cell)
            localize_output(cell, entries)
        if cell["cell_type"] != "markdown":
            continue
        text = linker.rewrite(entries[cell["id"]].text, name)
        if index == 0:
            text = with_run_time(text, _source(notebook["cells"][0]), f"{name}: the first cell")
            text += english_link(name)
        lines = text.split("\n")
        cell["source"] = [line + "\n" for line in lines[:-1]] + [lines[-1]]
    localize_widgets(twin)
    twin["metadata"]["language"] = "zh-CN"
    return twin


def dumps(notebook: dict) -> str:
    """Return a notebook as the series writes it (nbformat's layout)."""
    return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"


def skeleton(notebook_path: Path) -> Path:
    """Write the translation file with a section for every markdown cell: current
    translations kept, a stale one kept under its old text with a STALE note and the new hash,
    a missing one as the English text under TODO-翻译. Return its path."""
    notebook = json.loads(notebook_path.read_text(encoding="utf-8"))
    entries = read_translation(translation_path(notebook_path))
    parts = [f"<!-- the Chinese translation of notebooks/{relative(notebook_path)}: one section "
             "per markdown cell (scripts/build_twins.py) -->"]
    for cell in markdown_cells(notebook):
        source, entry = _source(cell), entries.get(cell["id"])
        if entry is None:
            text = f"{TODO}\n{source}"
        elif entry.source_hash != source_hash(source):
            text = f"{TODO} STALE: the English changed; old translation below\n{entry.text}"
        else:
            text = entry.text
        parts.append(f"<!-- cell {cell['id']} source {source_hash(source)} -->\n{text}")
    for cell in notebook["cells"]:  # the printed texts translated, kept as they are
        entry = entries.get(OUTPUT + cell["id"])
        if entry is not None:
            parts.append(f"<!-- output {cell['id']} source {entry.source_hash} -->\n{entry.text}")
    path = translation_path(notebook_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(parts) + "\n", encoding="utf-8")
    return path


def translated_notebooks() -> list[Path]:
    """Return the English notebooks that have a translation file."""
    return [path for path in english_notebooks() if translation_path(path).exists()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", type=Path, nargs="*",
                        help="English notebooks whose twins to build (default: every one that "
                             "has a translation file)")
    parser.add_argument("--check", action="store_true", help="report, write nothing")
    parser.add_argument("--skeleton", type=Path, nargs="+", metavar="NOTEBOOK",
                        help="add the missing sections to these notebooks' translation files")
    arguments = parser.parse_args(argv)
    if arguments.skeleton:
        for path in arguments.skeleton:
            print(f"wrote {skeleton(path).relative_to(ROOT)}")
        return 0
    chosen = [path.resolve() for path in arguments.notebooks] or translated_notebooks()
    found = [line for path in chosen for line in problems(path)]
    if arguments.check or found:
        for line in found:
            print(line, file=sys.stderr)
        print(f"{len(chosen)} translated notebooks, {len(found)} problem(s)")
        return 1 if found else 0
    linker = Linker()
    for path in chosen:
        target = twin_path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(dumps(build_twin(path, linker)), encoding="utf-8")
        print(f"wrote {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
