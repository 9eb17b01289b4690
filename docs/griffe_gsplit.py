"""A griffe extension for gsplit's API reference (loaded by mkdocstrings, see mkdocs.yml).

1. gsplit's docstrings are Google style with Sphinx roles (``:func:`launch```, ``:class:`~gsplit.Graph```)
   and ``::`` before literal blocks. mkdocstrings renders Markdown, so each role becomes a link to the
   object's entry when griffe can resolve the name (an optional cross-reference: no warning when the
   object has no entry) and inline code otherwise; a trailing ``::`` becomes ``:``; an ``Example:``
   section is read as griffe's ``Examples:``, so its doctests render as code.
2. Every name in ``__all__`` of the modules listed in the ``public`` option must have a docstring: a
   missing one is logged as a warning, which fails ``mkdocs build --strict`` (``./dev docs``, CI).
"""

from __future__ import annotations

import html
import re
from typing import Any, Iterable, Iterator, List, Optional

import griffe

logger = griffe.get_logger("griffe_gsplit")

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|obj|exc):`(~?)([^`]+)`")
_UNRESOLVED = (griffe.NameResolutionError, griffe.AliasResolutionError, griffe.CyclicAliasError)


def _target(obj: griffe.Object | griffe.Alias, name: str) -> Optional[str]:
    """The path ``name`` means where ``obj``'s docstring uses it, or None when griffe cannot tell."""
    name = name.lstrip(".")
    if name.startswith("gsplit."):
        return name
    first, _, rest = name.partition(".")
    try:
        path = obj.resolve(first)
    except _UNRESOLVED:  # a name from outside gsplit (torch.Tensor) or a local one: shown as code
        return None
    return _public_path(obj, f"{path}.{rest}" if rest else path)


def _public_path(obj: griffe.Object | griffe.Alias, path: str) -> str:
    """``path`` as the reference documents it: the object's name in the package right above its module when
    that package exports it (``gsplit.launcher.start.launch`` -> ``gsplit.launcher.launch``), else ``path``."""
    module, _, name = path.rpartition(".")
    package = module.rpartition(".")[0]
    try:
        exports = {str(e) for e in (obj.modules_collection[package].exports or ())} if package else set()
    except (KeyError, *_UNRESOLVED):
        return path
    return f"{package}.{name}" if name in exports else path


def rewrite_roles(obj: griffe.Object | griffe.Alias, text: str) -> str:
    """``text`` with every Sphinx role replaced by an optional cross-reference (or inline code)."""
    def replace(m: re.Match) -> str:
        short, name = m.group(1) == "~", m.group(2)
        shown = f"<code>{html.escape(name.rsplit('.', 1)[-1] if short else name)}</code>"
        path = _target(obj, name)
        if path is None:
            return shown
        return f'<autoref identifier="{html.escape(path)}" optional>{shown}</autoref>'

    text = _ROLE.sub(replace, text)
    # griffe's section for doctests is "Examples:"; "Example (one process):" keeps its words as a line above it
    text = re.sub(r"^([ \t]*)Examples? \((.+)\):$", lambda m: f"{m.group(1)}{m.group(2)[:1].upper()}{m.group(2)[1:]}:"
                  f"\n\n{m.group(1)}Examples:", text, flags=re.M)
    text = re.sub(r"^(\s*)Example:$", r"\1Examples:", text, flags=re.M)
    text = split_grouped_parameters(text)
    return re.sub(r"(?<=\S)::$", ":", text, flags=re.M)


_SECTION = re.compile(r"^(\s*)(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Other Parameters):\s*$")
_GROUPED = re.compile(r"^(\s*)(\*{0,2}\w+(?:\s*,\s*\*{0,2}\w+)+)(\s*\([^)]*\))?:(\s.*|)$")


def split_grouped_parameters(text: str) -> str:
    r"""``shuffle, drop_last: as in DGL.`` in an ``Args:`` section as one item per name, each with the description.

    griffe reads a grouped item as one parameter named ``shuffle, drop_last``, which matches no parameter of
    the signature and so is shown without its default, as *required*; one item per name gets each its own
    default from the signature.

    Example:
        >>> print(split_grouped_parameters("Args:\n    a, b: two numbers.\n        More.\n    c: one."))
        Args:
            a: two numbers.
                More.
            b: two numbers.
                More.
            c: one.
    """
    lines = text.split("\n")
    out: List[str] = []
    i, section_indent, item_indent = 0, None, None
    while i < len(lines):
        line = lines[i]
        indent = len(line) - len(line.lstrip())
        if _SECTION.match(line):
            section_indent, item_indent = indent, None
            out.append(line)
            i += 1
            continue
        if section_indent is not None and line.strip():
            if indent <= section_indent:
                section_indent = None
            elif item_indent is None:
                item_indent = indent
        m = _GROUPED.match(line) if section_indent is not None and indent == item_indent else None
        if m is None:
            out.append(line)
            i += 1
            continue
        body = [line[m.end(3) if m.group(3) else m.end(2):]]  # ": description" of the first line
        i += 1
        while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > item_indent):
            if not lines[i].strip() and (i + 1 >= len(lines) or
                                         len(lines[i + 1]) - len(lines[i + 1].lstrip()) <= item_indent):
                break
            body.append(lines[i])
            i += 1
        for name in (n.strip() for n in m.group(2).split(",")):
            out.append(f"{m.group(1)}{name}{m.group(3) or ''}{body[0]}")
            out.extend(body[1:])
    return "\n".join(out)


def missing_docstrings(modules: griffe.ModulesCollection, public: Iterable[str]) -> List[str]:
    """One message per name in the ``__all__`` of a ``public`` module that has no docstring.

    Dunder names (``__version__``) and exported submodules (checked through their own ``__all__``) are
    left out.
    """
    problems = []
    for module_path in public:
        module = modules[module_path]
        for name in map(str, module.exports or ()):
            if name.startswith("__"):
                continue
            try:
                member = module[name]
                target = member.final_target if member.is_alias else member
            except (KeyError, *_UNRESOLVED) as e:
                problems.append(f"{module_path}.{name} is listed in __all__ but griffe cannot find it ({e!r})")
                continue
            if target.is_module:
                continue
            if not (target.docstring and target.docstring.value.strip()):
                problems.append(f"{module_path}.{name} is public (in {module_path}.__all__) but has no docstring: "
                                f"add one ({target.relative_filepath}:{target.lineno})")
    return problems


def _walk(obj: griffe.Object) -> Iterator[griffe.Object]:
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member)


class GsplitDocs(griffe.Extension):
    """Rewrites the roles of every docstring of ``package`` and warns on a public name without a docstring."""

    def __init__(self, public: Iterable[str] = (), package: str = "gsplit") -> None:
        super().__init__()
        self.public = list(public)
        self.package = package

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.name != self.package:
            return
        for obj in _walk(pkg):
            if obj.docstring is not None:
                obj.docstring.value = rewrite_roles(obj, obj.docstring.value)
        for problem in missing_docstrings(loader.modules_collection, self.public):
            logger.warning(problem)
