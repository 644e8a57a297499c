"""``dataclass``, ``field``, ``fields`` and ``replace`` for the modules ``affrun exec`` imports before every rank.

mypy sees the standard library's ``dataclasses`` (the ``TYPE_CHECKING`` branch below), so these classes are
checked exactly as dataclasses. At run time the same class bodies are turned into plain classes with the
subset of dataclass behaviour affrun uses: keyword or positional ``__init__`` with defaults and
``default_factory``, fields inherited from a base made here, ``frozen``, ``__eq__`` and ``__hash__`` over the fields (``compare=False`` left out),
the dataclass ``__repr__``, :func:`fields` (``name``, ``default``) and :func:`replace`.

Why (measured with ``python -X importtime`` and wall times of ``affrun exec -- true`` on a 2-core machine, see
docs/design.md): ``import dataclasses`` costs 10 to 20 ms, because it imports ``inspect`` and with it ``ast``,
``dis``, ``tokenize``, ``enum`` and ``re``; and each ``@dataclass`` compiles its methods with ``exec``, about
1 ms a class. The exec path defines about twenty classes, so dataclasses alone were more than a whole
``python -c pass`` (15 ms). Here a class costs a few microseconds. Modules off the exec path use
``dataclasses`` itself; ``fields`` and ``replace`` below accept both kinds.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as true)
if TYPE_CHECKING:
    from dataclasses import dataclass as dataclass
    from dataclasses import field as field
    from dataclasses import fields as fields
    from dataclasses import replace as replace
    from typing import Any


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
FIELDS = "__affrun_fields__"


class Field:
    """What :func:`fields` returns for a class made here: its ``name`` and ``default`` (like ``dataclasses.Field``)."""

    __slots__ = ("compare", "default", "default_factory", "name")

    def __init__(self, default: Any = MISSING, default_factory: Any = MISSING, compare: bool = True) -> None:
        self.name = ""
        self.default = default
        self.default_factory = default_factory
        self.compare = compare

    def __repr__(self) -> str:
        return f"Field(name={self.name!r}, default={self.default!r})"


def _field(*, default: Any = MISSING, default_factory: Any = MISSING, compare: bool = True) -> Any:
    return Field(default, default_factory, compare)


def _fields(cls_or_obj: Any) -> tuple[Any, ...]:
    own: tuple[Field, ...] | None = getattr(cls_or_obj, FIELDS, None)
    if own is not None:
        return own
    import dataclasses  # a real dataclass, off the exec path

    return dataclasses.fields(cls_or_obj)


def _replace(obj: Any, /, **changes: Any) -> Any:
    own: tuple[Field, ...] | None = getattr(type(obj), FIELDS, None)
    if own is None:
        import dataclasses

        return dataclasses.replace(obj, **changes)
    for f in own:
        if f.name not in changes:
            changes[f.name] = getattr(obj, f.name)
    return type(obj)(**changes)


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    own: tuple[Field, ...] = getattr(type(self), FIELDS)
    name = type(self).__name__
    if len(args) > len(own):
        raise TypeError(f"{name}() takes {len(own)} positional arguments but {len(args)} were given")
    for i, f in enumerate(own):
        if i < len(args):
            if f.name in kwargs:
                raise TypeError(f"{name}() got multiple values for argument {f.name!r}")
            value = args[i]
        elif f.name in kwargs:
            value = kwargs.pop(f.name)
        elif f.default is not MISSING:
            value = f.default
        elif f.default_factory is not MISSING:
            value = f.default_factory()
        else:
            raise TypeError(f"{name}() missing required argument: {f.name!r}")
        object.__setattr__(self, f.name, value)
    if kwargs:
        raise TypeError(f"{name}() got an unexpected keyword argument {next(iter(kwargs))!r}")


def _key(self: Any) -> tuple[Any, ...]:
    return tuple(getattr(self, f.name) for f in getattr(type(self), FIELDS) if f.compare)


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _key(self) == _key(other)


def _hash(self: Any) -> int:
    return hash(_key(self))


def _repr(self: Any) -> str:
    body = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in getattr(type(self), FIELDS))
    return f"{type(self).__qualname__}({body})"


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    raise AttributeError(f"cannot assign to field {name!r}: {type(self).__name__} is frozen")


def _frozen_delattr(self: Any, name: str) -> None:
    raise AttributeError(f"cannot delete field {name!r}: {type(self).__name__} is frozen")


def _make(cls: Any, frozen: bool) -> Any:
    own: dict[str, Field] = {}
    for base in reversed(cls.__mro__[1:]):  # a base's fields come first, as in dataclasses
        own.update((f.name, f) for f in base.__dict__.get(FIELDS, ()))
    for name in cls.__dict__.get("__annotations__", {}):  # noqa: RUF063 (inspect is what this module avoids)
        value = cls.__dict__.get(name, MISSING)
        f = value if isinstance(value, Field) else Field(default=value)
        f.name = name
        if isinstance(value, Field):  # the class attribute is the default, as dataclasses leaves it
            if f.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
        own[name] = f
    setattr(cls, FIELDS, tuple(own.values()))
    cls.__init__ = _init
    cls.__repr__ = _repr
    cls.__eq__ = _eq
    cls.__hash__ = _hash if frozen else None  # as dataclasses: eq without frozen makes instances unhashable
    if frozen:
        cls.__setattr__ = _frozen_setattr
        cls.__delattr__ = _frozen_delattr
    return cls


def _dataclass(cls: Any = None, /, *, frozen: bool = False) -> Any:
    if cls is None:
        return lambda c: _make(c, frozen)
    return _make(cls, frozen)


if not TYPE_CHECKING:
    dataclass, field, fields, replace = _dataclass, _field, _fields, _replace
