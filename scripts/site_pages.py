"""The HTML pieces of the static site (used by build_site.py).

nbconvert's exporter with the site's template (MathJax 3 in place of nbconvert's MathJax 2
block), MathJax's head block, the navigation bar, each page's contents, the rewriting of the
notebooks' relative links into links inside the site (``Links``), the pages holding a copy of
a source file, the index, and the text rules every page goes through (``as_text``: emoji that
a plain browser draws as an empty box become words).
"""

from __future__ import annotations

import html
import posixpath
import re
from pathlib import Path
from urllib.parse import quote, unquote

# Characters that a browser without an emoji font draws as an empty box, and the words for them
EMOJI_TEXT = {"\N{HUGGING FACE}": "Hugging Face"}
# an index row must not point at a table or section of the README that the index does not hold
SELF_REFERENCE = re.compile(r"\s*\((?:see\s+)?(?:the\s+)?(?:table|section|list)\s+"
                            r"(?:below|above)\)", re.IGNORECASE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
A_HREF = re.compile(r'(<a\s[^>]*?\bhref=")([^"]*)(")')
IMG_SRC = re.compile(r'(<img\s[^>]*?\bsrc=")([^"]*)(")')
#: an image of the repository that a page shows is copied here, under its repository path
IMAGES = "images"
A_ELEMENT = re.compile(r'<a\s[^>]*?\bhref="([^"]*)"[^>]*>(.*?)</a>', re.DOTALL)
HEADING = re.compile(r'<h([1-6]) id="([^"]*)">(.*?)</h\1>', re.DOTALL)
ANCHOR_LINK = re.compile(r'<a class="anchor-link"[^>]*>.*?</a>', re.DOTALL)

# MathJax 3, configured like nbconvert's MathJax 2 block: $...$ and \(...\) inline, $$...$$ and
# \[...\] displayed, \$ for a dollar sign. ipywidgets 8 typesets a widget's label with MathJax
# 2's call (MathJax.Hub.Queue): the small shim after the script runs it with MathJax 3's.
MATHJAX_HEAD = r"""<script>
window.MathJax = {
  tex: {inlineMath: [['$', '$'], ['\\(', '\\)']], displayMath: [['$$', '$$'], ['\\[', '\\]']],
        processEscapes: true, processEnvironments: true, tags: 'ams'},
  options: {ignoreHtmlClass: 'tex2jax_ignore', processHtmlClass: 'tex2jax_process'}
};
</script>
<script src="%s"></script>
<script>
if (window.MathJax) {
  window.MathJax.Hub = {Queue: function (job) {
    var startup = window.MathJax.startup;
    if (!startup) { return; }  // MathJax did not load
    var element = job && job[2];
    startup.promise = startup.promise.then(function () {
      return window.MathJax.typesetPromise(element ? [element] : undefined);
    });
  }};
}
</script>"""

# nbconvert's lab template, with MathJax 3 from resources.site_mathjax instead of its
# MathJax 2 from cdnjs, and the style of the navigation and the contents
TEMPLATE = "gradaccum_site.html.j2"
TEMPLATE_SOURCE = """{%- extends 'index.html.j2' -%}
{%- block extra_css -%}
<style type="text/css">{{ resources.site_css }}</style>
{%- endblock extra_css -%}
{%- block html_head_js_mathjax -%}
{{ resources.site_mathjax }}
{%- endblock html_head_js_mathjax -%}
"""

#: CJK fonts named in the pages' font stacks, after the system's: a machine with none of them
#: and no other CJK font shows boxes for Chinese (make doctor names the package to install)
CJK_FONTS = ('"Noto Sans CJK SC", "Noto Sans SC", "Source Han Sans SC", "PingFang SC", '
             '"Microsoft YaHei", "WenQuanYi Micro Hei"')

CSS = """
nav.gradaccum-nav { font: 14px/1.6 system-ui, sans-serif; padding: 8px 16px;
  margin-bottom: 8px; border-bottom: 1px solid #ddd; display: flex; flex-wrap: wrap;
  gap: 24px; }
nav.gradaccum-toc { font: 14px/1.5 system-ui, sans-serif; margin: 8px 16px 16px;
  padding: 8px 16px; border: 1px solid #ddd; border-radius: 4px; background: #fafafa; }
nav.gradaccum-toc summary { font-weight: 600; cursor: pointer; }
nav.gradaccum-toc ul { list-style: none; margin: 4px 0 0; padding: 0; columns: 2 28em; }
nav.gradaccum-toc li { break-inside: avoid; }
nav.gradaccum-toc li.level-3 { padding-left: 1.5em; }
:lang(zh-CN) { font-family: system-ui, """ + CJK_FONTS + """, sans-serif; }
"""


def chinese(page: str) -> str:
    """A page of the Chinese edition: marked ``lang="zh-CN"`` (its font stack names CJK fonts)."""
    return re.sub(r"<html(\s[^>]*)?>", '<html lang="zh-CN">', page, count=1)


def exporter(widgets_url: str | None):  # noqa: ANN201 - nbconvert's HTMLExporter
    """nbconvert's exporter with TEMPLATE; the widget files from ``widgets_url`` (a folder
    relative to the page), or from the CDN when None."""
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    result = HTMLExporter(template_name="lab", template_file=TEMPLATE,
                          extra_loaders=[DictLoader({TEMPLATE: TEMPLATE_SOURCE})])
    if widgets_url is not None:
        result.require_js_url = f"{widgets_url}/require.js"
        result.widget_renderer_url = f"{widgets_url}/embed-amd.js"
    return result


def mathjax_head(url: str) -> str:
    return MATHJAX_HEAD % html.escape(url)


def as_text(page: str) -> str:
    """``page`` with each emoji of ``EMOJI_TEXT`` written as words."""
    for emoji, words in EMOJI_TEXT.items():
        page = page.replace(emoji, words)
    return page


def without_self_references(markdown: str) -> str:
    """README prose fit for the index: no "(table below)" pointing at what the index lacks."""
    return SELF_REFERENCE.sub("", markdown)


def markdown(text: str) -> str:
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    return markdown2html_mistune(text)


def inline(text: str) -> str:
    """Markdown of one line as inline HTML (no enclosing paragraph)."""
    return markdown(text).strip().removeprefix("<p>").removesuffix("</p>")


def github_ids(body: str) -> str:
    """``body`` with each heading's id (and its anchor link) as GitHub names it: lower case,
    punctuation dropped, spaces as hyphens, ``-1``, ``-2``... for repeats. A Markdown page's
    ``page.md#sizes-and-devices`` then works on GitHub and in the site alike."""
    used: dict[str, int] = {}

    def one(match: re.Match) -> str:
        level, old, inner = match.groups()
        label = html.unescape(re.sub(r"<[^>]+>", "", ANCHOR_LINK.sub("", inner))).strip()
        slug = re.sub(r"[^\w\- ]", "", label.lower()).replace(" ", "-")
        repeat = used.get(slug, 0)
        used[slug] = repeat + 1
        slug = html.escape(f"{slug}-{repeat}" if repeat else slug)
        inner = inner.replace(f'href="#{old}"', f'href="#{slug}"')
        return f'<h{level} id="{slug}">{inner}</h{level}>'

    return HEADING.sub(one, body)


def markdown_title(text: str, fallback: str) -> str:
    """The first ``# `` heading of a Markdown text (without the #), else ``fallback``."""
    return next((line[2:].strip() for line in text.splitlines() if line.startswith("# ")),
                fallback)


def markdown_point(text: str) -> str:
    """The first paragraph after a Markdown text's title: the page's point."""
    lines = text.splitlines()
    start = next((i + 1 for i, line in enumerate(lines) if line.startswith("# ")), 0)
    paragraph: list[str] = []
    for line in lines[start:]:
        if line.strip():
            paragraph.append(line.strip())
        elif paragraph:
            break
    return " ".join(paragraph)


def up(site_page: str) -> str:
    """The relative way from ``site_page``'s folder back to the site's root ("" or "../...")."""
    return "../" * site_page.count("/")


def nav(links: list[tuple[str, str]]) -> str:
    """The bar at the top of a page: (href, already escaped HTML label) pairs."""
    items = "".join(f'<a href="{html.escape(href)}">{label}</a>' for href, label in links)
    return f'<nav class="gradaccum-nav">{items}</nav>'


def contents(body: str) -> str:
    """The page's own contents: a link to each ``h2`` and ``h3`` heading by its anchor ("" when
    the page has none)."""
    items = []
    for level, ident, inner in HEADING.findall(body):
        if level in {"2", "3"}:
            label = ANCHOR_LINK.sub("", inner).strip()
            items.append(f'<li class="level-{level}"><a href="#{ident}">{label}</a></li>')
    if not items:
        return ""
    return ('<nav class="gradaccum-toc" aria-label="Contents"><details open>'
            f'<summary>Contents</summary><ul>{"".join(items)}</ul></details></nav>')


def source_page_path(repo_path: str) -> str:
    return f"source/{repo_path}.html"


class Links:
    """Where the files that the notebooks link are in the site.

    ``pages`` maps a repository path (``notebooks/01_the_math.ipynb``, ``docs/running.md``) to
    its page in the site (``01_the_math.html``, ``docs/running.html``). Any other file of the
    repository that a page links gets a page of its own holding a copy of its text
    (``source/<path>.html``), listed in ``sources``; an image a page shows (``<img src>``) is
    copied to ``images/<path>``, listed in ``images``; a link to what is not a file of the
    repository is refused (ValueError). A link to a path of ``pending`` (a notebook the README
    lists that is not written yet) becomes its text, unlinked.
    """

    def __init__(self, repo: Path, pages: dict[str, str], pending: set[str] = frozenset()
                 ) -> None:
        self.repo = repo
        self.pages = pages
        self.pending = set(pending)
        self.unlinked: dict[str, list[str]] = {}  # pending path -> the pages that named it
        self.sources: dict[str, list[str]] = {}  # repository path -> the pages that link it
        self.images: set[str] = set()  # repository paths of the images the pages show

    def target(self, repo_path: str, linked_from: str) -> str:
        if repo_path in self.pages:
            return self.pages[repo_path]
        if not (self.repo / repo_path).is_file():
            raise ValueError(f"{linked_from} links {repo_path}, which is not a file of "
                             f"{self.repo}")
        pages = self.sources.setdefault(repo_path, [])
        if linked_from not in pages:
            pages.append(linked_from)
        return source_page_path(repo_path)

    @staticmethod
    def repo_path(url: str, repo_folder: str, site_page: str) -> tuple[str, str] | None:
        """(the repository path a relative link names, its "#fragment" or ""), or None for a
        link that is not to a file (external, an anchor on the page)."""
        if not url or url.startswith(("#", "/", "?")) or SCHEME.match(url):
            return None
        path, hash_mark, fragment = url.partition("#")
        path = path.partition("?")[0]
        repo_path = posixpath.normpath(posixpath.join(repo_folder, unquote(path)))
        if repo_path == ".." or repo_path.startswith("../"):
            raise ValueError(f"{site_page}: the link {url!r} leaves the repository")
        return repo_path, hash_mark + fragment

    def rewrite(self, body: str, repo_folder: str, site_page: str) -> str:
        """``body``'s relative links, written from ``repo_folder`` (where the notebook or the
        Markdown page is in the repository, "" for the README), as links from ``site_page``
        to pages of the site."""

        def unlink(match: re.Match) -> str:
            found = self.repo_path(html.unescape(match.group(1)), repo_folder, site_page)
            if found is None or found[0] not in self.pending:
                return match.group(0)
            self.unlinked.setdefault(found[0], []).append(site_page)
            return f'<span class="pending" title="not published yet">{match.group(2)}</span>'

        def one(match: re.Match) -> str:
            found = self.repo_path(html.unescape(match.group(2)), repo_folder, site_page)
            if found is None:
                return match.group(0)
            repo_path, fragment = found
            target = self.target(repo_path, site_page)
            relative = posixpath.relpath(target, posixpath.dirname(site_page) or ".")
            new = quote(relative) + fragment
            return match.group(1) + html.escape(new) + match.group(3)

        def image(match: re.Match) -> str:
            found = self.repo_path(html.unescape(match.group(2)), repo_folder, site_page)
            if found is None:  # a data: URL, or an image elsewhere
                return match.group(0)
            if not (self.repo / found[0]).is_file():
                raise ValueError(f"{site_page} shows {found[0]}, which is not a file of "
                                 f"{self.repo}")
            self.images.add(found[0])
            relative = posixpath.relpath(f"{IMAGES}/{found[0]}",
                                         posixpath.dirname(site_page) or ".")
            return match.group(1) + html.escape(quote(relative)) + match.group(3)

        if self.pending:
            body = A_ELEMENT.sub(unlink, body)
        return IMG_SRC.sub(image, A_HREF.sub(one, body))


def source_page(repo_path: str, text: str, linked_from: list[tuple[str, str]]) -> str:
    """A page holding ``text``, the file at ``repo_path``; ``linked_from``: (page, title)."""
    root = up(source_page_path(repo_path))
    back = ", ".join(f'<a href="{html.escape(root + page)}">{html.escape(title)}</a>'
                     for page, title in linked_from)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>{html.escape(repo_path)}</title>
<style>
body {{ font: 16px/1.5 system-ui, sans-serif; margin: 0 auto 2em; max-width: 1100px;
       color: #222; }}
h1, p {{ margin-left: 16px; margin-right: 16px; }}
h1 {{ font-size: 22px; }}
pre {{ font: 13px/1.45 ui-monospace, monospace; background: #f6f6f6; padding: 12px 16px;
      overflow-x: auto; border-top: 1px solid #ddd; border-bottom: 1px solid #ddd; }}
{CSS}</style>
</head>
<body>
{nav([(root + "index.html", "&#8962; all notebooks")])}
<h1><code>{html.escape(repo_path)}</code></h1>
<p>A copy of this file of the repository, as it was when the site was built; linked from
{back}.</p>
<pre id="source"><code>{html.escape(text)}</code></pre>
</body>
</html>
"""


def index_page(title: str, time_header: str, rows: list[str], mathjax_url: str,
               notes: list[str], doc_rows: list[str] = (), zh_rows: list[str] = ()) -> str:
    """The index: ``rows`` are the notebook table's ``<tr>`` rows, ``doc_rows`` the README's
    and the documentation pages' rows, ``zh_rows`` the Chinese edition's, ``notes`` what the
    build used."""
    docs = "" if not doc_rows else f"""<h2 id="documentation">The README and the documentation</h2>
<table id="docs">
<thead><tr><th>page</th><th>what it is for</th></tr></thead>
<tbody>
{chr(10).join(doc_rows)}
</tbody>
</table>
"""
    if zh_rows:
        docs += f"""<h2 id="zh" lang="zh-CN">中文版</h2>
<p lang="zh-CN">每个笔记本的中文版：代码与输出和英文版相同，Markdown 是译文。</p>
<table id="zh-notebooks" lang="zh-CN">
<thead><tr><th>笔记本 / 页面</th><th>英文版</th></tr></thead>
<tbody>
{chr(10).join(zh_rows)}
</tbody>
</table>
"""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>{html.escape(title)}</title>
{mathjax_head(mathjax_url)}
<style>
body {{ font: 16px/1.5 system-ui, {CJK_FONTS}, sans-serif; max-width: 1100px; margin: 2em auto;
       padding: 0 1em; color: #222; }}
table {{ border-collapse: collapse; }}
th, td {{ border-top: 1px solid #ddd; padding: 8px; vertical-align: top; text-align: left; }}
td p {{ margin: 0; }}
td.time {{ white-space: nowrap; }}
.note {{ color: #555; font-size: 14px; }}
</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
<p>The series in reading order, with the outputs as committed (executed under the
<code>ci</code> profile), each notebook's exercises followed by a page of worked solutions.
The sliders show the state they were stored in: moving one here recomputes nothing, because
no Python runs behind a static page; for that, open the notebooks with <code>make lab</code>.</p>
<table id="notebooks">
<thead><tr><th>notebook</th><th>what it proves</th><th>{inline(time_header)}</th>
</tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody>
</table>
{docs}<p class="note">Built by <code>make site</code> (scripts/build_site.py) from README.md,
docs/ and notebooks/; {"; ".join(html.escape(note) for note in notes)}.</p>
</body>
</html>
"""
