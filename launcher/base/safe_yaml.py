"""Plain data from untrusted YAML: the one reader of ``--tuned`` files and ``affrun sbatch``'s site profiles. The
node graph is checked before any value is built; every refusal is one :class:`BadYAML` line (what is refused, and
why: docs/tune.md, "What a tuned file may hold")."""

from __future__ import annotations

from typing import Any

MAX_DEPTH = 32
MAX_VALUES = 100_000  # counted with every alias expanded
_CORE = "tag:yaml.org,2002:"
# The tags of plain data (PyYAML's safe constructor also builds sets, ordered pairs, bytes and dates).
PLAIN_TAGS = frozenset(_CORE + name for name in ("null", "bool", "int", "float", "str", "seq", "map", "merge"))


class BadYAML(ValueError):
    """Text that is not YAML affrun reads; the message is one short line."""


def _loader(c_parser: bool | None) -> type:
    """PyYAML's safe loader (libyaml's when available and ``c_parser`` is not False) without the implicit
    timestamp rule: dates stay strings."""
    import yaml

    base = yaml.CSafeLoader if c_parser is not False and getattr(yaml, "__with_libyaml__", False) else yaml.SafeLoader

    class PlainLoader(base):  # type: ignore[valid-type,misc]
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            """The pure-Python composer, stopped at :data:`MAX_DEPTH` levels (docs/tune.md)."""
            self.depth += 1
            try:
                if self.depth > MAX_DEPTH:
                    raise BadYAML(f"{_at(self.peek_event())}nested deeper than {MAX_DEPTH} levels")
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    PlainLoader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _CORE + "timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    return PlainLoader


def _at(node: Any) -> str:
    mark = getattr(node, "start_mark", None)
    return f"line {mark.line + 1}: " if mark is not None else ""


def _tag(tag: str) -> str:
    from launcher.base.untrusted import clip

    return clip("!!" + tag[len(_CORE):] if tag.startswith(_CORE) else tag, 60)


def _children(node: Any) -> list[Any]:
    value = node.value
    if isinstance(value, list):  # a sequence's items, a mapping's (key, value) pairs
        return [part for item in value for part in (item if isinstance(item, tuple) else (item,))]
    return []


def _no_twice(node: Any) -> None:
    """A mapping's own plain keys each once (a merged ``<<`` key may be overridden, as YAML's merge rule says)."""
    from launcher.base.untrusted import clip

    seen: set[tuple[str, str]] = set()
    for key, _ in node.value:
        if key.tag == _CORE + "merge" or not isinstance(key.value, str):
            continue
        if (key.tag, key.value) in seen:
            raise BadYAML(f"{_at(key)}the key {clip(key.value, 40)!r} is given twice in one mapping")
        seen.add((key.tag, key.value))


def check_nodes(root: Any) -> None:
    """Refuse a composed document whose values are not plain data, nest deeper than :data:`MAX_DEPTH`, expand to more
    than :data:`MAX_VALUES` values or hold an alias inside its own value; each node visited once."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_: set[int] = set()  # nodes whose values are being walked: the current node's ancestors
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            kids = _children(node)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            open_.discard(key)
            if depth[key] > MAX_DEPTH:
                raise BadYAML(f"{_at(node)}nested deeper than {MAX_DEPTH} levels")
            if size[key] > MAX_VALUES:
                raise BadYAML(f"{_at(node)}more than {MAX_VALUES} values once its aliases are expanded")
            continue
        if key in size:
            continue
        if key in open_:
            raise BadYAML(f"{_at(node)}an alias refers to the value that holds it")
        if node.tag not in PLAIN_TAGS:
            raise BadYAML(f"{_at(node)}the tag {_tag(node.tag)} is not plain data (a string, number, true/false, "
                          "null, list or mapping)")
        if node.tag == _CORE + "map":
            _no_twice(node)
        open_.add(key)
        stack.append((node, True))
        stack.extend((kid, False) for kid in _children(node))


def load_yaml(data: bytes | str, *, c_parser: bool | None = None) -> Any:
    """The plain data of the one YAML document ``data`` (``None`` for an empty one), or :class:`BadYAML`.
    ``c_parser=False``: PyYAML's pure-Python parser even where libyaml is there (the tests run both)."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            raise BadYAML("not UTF-8 text") from None
    import yaml

    from launcher.base.untrusted import clip, short

    loader = None
    try:
        loader = _loader(c_parser)(data)
        node = loader.get_single_node()
        if node is None:
            return None
        check_nodes(node)
        return loader.construct_document(node)
    except (ValueError, TypeError, KeyError, OverflowError) as exc:
        if isinstance(exc, BadYAML):
            raise
        # explicit tags (!!int abc) and integers of more than 4,300 digits
        problem = f"{short(exc.args[0], 40)} is not a value of its tag" if isinstance(exc, KeyError) else (
            str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        raise BadYAML(f"a value YAML cannot build: {clip(problem)}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise BadYAML(f"not valid YAML{where}: {clip(problem)}") from None
    except RecursionError:  # the pure-Python composer recurses once per level
        raise BadYAML(f"nested deeper than {MAX_DEPTH} levels") from None
    finally:
        if loader is not None:
            loader.dispose()
